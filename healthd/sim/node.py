"""A simulated GPU node: the fake NVML library under the real pynvml, the simulated
bandwidth probe and the fake dcgmi, all from one machine spec.

`healthd check --sim SPEC` prepares its planned checks with it (`prepare`: a
recording's checks whose inputs it does not hold are SKIPPED, healthd.sim.recorded); an agent
on the simulated machine is built from the adapted config (`adapt`) and handed the
simulated probes (`probes`), so the product never knows it is simulated.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import checks as registry
from checks.base import CheckContext, Probes
from checks.dcgm import DcgmCheck
from healthd.config import Config
from healthd.plans import Planned
from healthd.sim.cuda import SimBandwidthProbe
from healthd.sim.dcgm import DcgmSim, fake_dcgmi_command
from healthd.sim.fakenvml import FakeNvml, install
from healthd.sim.machine import MachineSpec, MachineSpecError, load_machine_spec
from healthd.sim.network import SimNetwork
from healthd.sim.recorded import missing_inputs, replayable

# Without a driver the DCGM host engine cannot start: dcgmi finds no one to talk to.
NO_DRIVER_DCGM = DcgmSim(host_engine="none")


class SimulationError(ValueError):
    """The simulation cannot start (unreadable or invalid machine spec)."""


@dataclass
class SimulatedNode:
    spec: MachineSpec
    nvml: FakeNvml
    bandwidth: SimBandwidthProbe
    network: SimNetwork | None = None  # the simulated fleet's links (multinode only)

    @property
    def node(self) -> str:
        return self.spec.node

    def probes(self) -> Probes:
        """The simulated bandwidth probe, and the fleet's links and pings if any."""
        if self.network is None:
            return Probes(bandwidth=self.bandwidth)
        return Probes(bandwidth=self.bandwidth, links=self.network.links(self.spec.node),
                      ping=self.network.prober(self.spec.node))

    def prepare(self, ctx: CheckContext, planned: Sequence[Planned]) -> list[Planned]:
        """Point the context and the planned checks at the simulated hardware."""
        self.probes().apply(ctx)
        ctx.node_name = ctx.node_name or self.spec.node
        if ctx.expected_gpus is None:
            ctx.expected_gpus = self.spec.gpus.count  # the machine should have them all
        return [replayable(self.spec, self._simulated(item)) for item in planned]

    def adapt(self, config: Config) -> Config:
        """`config` for an agent on this machine: `dcgmi` is the fake one, the
        machine should have all its GPUs (unless the config says how many), and the
        checks a recording holds no inputs for are off (they would invent results)."""
        dcgm = config.check_section("dcgm")
        params = {**dcgm.params, "command": self._dcgmi()}
        checks = {**config.checks, "dcgm": dcgm.model_copy(update={"params": params})}
        for name in registry.REGISTRY:  # a recording's agent runs only what it holds
            if missing_inputs(self.spec, config.build_check(name)):
                checks[name] = config.check_section(name).model_copy(update={"enabled": False})
        expected = self.spec.gpus.count if config.expected_gpus is None else config.expected_gpus
        return config.model_copy(update={"checks": checks, "expected_gpus": expected})

    def _dcgmi(self) -> list[str]:
        dcgm = self.spec.dcgm
        if not self.spec.driver_present:  # no driver: DCGM cannot run either
            dcgm = NO_DRIVER_DCGM
        return fake_dcgmi_command(dcgm)

    def _simulated(self, item: Planned) -> Planned:
        if isinstance(item.check, DcgmCheck):
            params = {**item.check.params.model_dump(), "command": self._dcgmi()}
            return replace(item, check=DcgmCheck(params))
        return item


@contextmanager
def simulate(source: str | Path | MachineSpec) -> Iterator[SimulatedNode]:
    """Install the simulated machine for the duration of the block."""
    try:
        spec = source if isinstance(source, MachineSpec) else load_machine_spec(source)
    except MachineSpecError as exc:
        raise SimulationError(str(exc)) from exc
    with install(spec) as fake:
        probe = SimBandwidthProbe(spec, clock=fake.clock, faults=fake.faults_for)
        yield SimulatedNode(spec, fake, probe)
