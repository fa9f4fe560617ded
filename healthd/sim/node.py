"""A simulated GPU node for one-shot runs: the fake NVML library under the real
pynvml, the simulated bandwidth probe and the fake dcgmi, all from one machine spec.

`healthd check --sim SPEC` uses it; so do tests that run checks end to end.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from checks.base import CheckContext
from checks.dcgm import DcgmCheck
from checks.ping import PingCheck
from healthd.once import Planned
from healthd.sim.cuda import SimBandwidthProbe
from healthd.sim.dcgm import DcgmSim, fake_dcgmi_command
from healthd.sim.fakenvml import FakeNvml, install
from healthd.sim.machine import MachineSpec, MachineSpecError, load_machine_spec
from healthd.sim.network import SimNetwork

NO_DRIVER_OUTPUT = "v4-runtime-error"  # what DCGM says when it cannot start


class SimulationError(ValueError):
    """The simulation cannot start (unreadable or invalid machine spec)."""


@dataclass
class SimulatedNode:
    spec: MachineSpec
    nvml: FakeNvml
    bandwidth: SimBandwidthProbe
    network: SimNetwork | None = None  # the simulated fleet's links (multinode only)

    def prepare(self, ctx: CheckContext, planned: Sequence[Planned]) -> list[Planned]:
        """Point the context and the planned checks at the simulated hardware."""
        ctx.bandwidth_probe = self.bandwidth
        if self.network is not None:
            ctx.link_reader = self.network.links(self.spec.node)
        ctx.node_name = ctx.node_name or self.spec.node
        if ctx.expected_gpus is None:
            ctx.expected_gpus = self.spec.gpus.count  # the machine should have them all
        return [self._simulated(item) for item in planned]

    def _simulated(self, item: Planned) -> Planned:
        if isinstance(item.check, DcgmCheck):
            params = item.check.params.model_dump()
            dcgm = self.spec.dcgm
            if not self.spec.driver_present:  # no driver: DCGM cannot run either
                dcgm = DcgmSim(output=NO_DRIVER_OUTPUT)
            params["command"] = fake_dcgmi_command(dcgm)
            return replace(item, check=DcgmCheck(params))
        if isinstance(item.check, PingCheck) and self.network is not None:
            prober = self.network.prober(self.spec.node)
            return replace(item, check=PingCheck(item.check.params, prober=prober))
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
