"""A simulated GPU node: the fake NVML library under the real pynvml, the simulated
bandwidth probe, the fake dcgmi and a kernel-log file, all from one machine spec.

`healthd check --sim SPEC` builds its checks with the machine's stand-ins
(`check_probes`) and prepares them (`prepare`: a recording's checks whose inputs it
does not hold are SKIPPED, healthd.sim.recorded); an agent on the simulated machine
is built from the adapted config (`adapt`) and handed the simulated probes
(`probes`), so the product never knows it is simulated.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import checks as registry
from checks.base import CheckContext, Peer
from checks.dcgm import DcgmCheck
from checks.kernel_log import KernelLog
from checks.probes import GpuSource, KernelLogSource, Probes, RdmaReader
from checks.rdma import SysfsRdmaReader
from healthd.check.plans import Planned
from healthd.config import Config
from healthd.config.agent import KernelLogSettings
from healthd.sim.control import ControlFile
from healthd.sim.cuda import SimBandwidthProbe
from healthd.sim.dcgm import DcgmSim, fake_dcgmi_command
from healthd.sim.fakenvml import FakeNvml, install, monotonic_clock
from healthd.sim.kernellog import NotRecordedLog, SimKernelLog
from healthd.sim.machine import MachineSpec, MachineSpecError, RdmaSpec, load_machine_spec
from healthd.sim.network import SimNetwork
from healthd.sim.rdma import NotRecordedRdma, SimRdma
from healthd.sim.recorded import missing_inputs, replayable
from healthd.sim.shared import shared_machine

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
    workdir: Path | None = None  # the machine's files (kernel log); None: none
    kernel_log: SimKernelLog | None = None  # None: none (a recording that holds none)
    rdma: SimRdma | None = None  # the fake /sys/class/infiniband (None: not recorded)

    def start_files(self, workdir: Path) -> None:
        """Write the machine's files under `workdir`: its kernel log's history (unless
        an earlier process on this machine did) and its RDMA sysfs tree."""
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        if self.spec.holds("kernel_log"):
            self.kernel_log = SimKernelLog(workdir / "kmsg", self.uptime)
            if self.kernel_log.empty:
                self.kernel_log.write_history(self.spec.kernel_log or [])
        if self.spec.holds("rdma"):
            self.rdma = SimRdma(workdir / "infiniband", self.spec.rdma or RdmaSpec())

    def rdma_reader(self) -> RdmaReader | None:
        """The rdma check's reader: the machine's fake sysfs tree (None: no files)."""
        if self.workdir is None:
            return None
        if self.rdma is None:
            return NotRecordedRdma()
        return SysfsRdmaReader(self.rdma.root)

    def kernel_log_source(self) -> KernelLogSource:
        """What a one-shot check reads the machine's kernel log through."""
        log = self.kernel_log
        if log is None:
            return NotRecordedLog()
        return KernelLog(log.path, uptime=self.uptime)

    @property
    def node(self) -> str:
        return self.spec.node

    def probes(self) -> Probes:
        """The simulated bandwidth probe, and the fleet's links and pings if any."""
        if self.network is None:
            return Probes(bandwidth=self.bandwidth, uptime=self.uptime, rdma=self.rdma_reader())
        return Probes(bandwidth=self.bandwidth, links=self.network.links(self.spec.node),
                      ping=self.network.prober(self.spec.node), uptime=self.uptime,
                      rdma=self.rdma_reader())

    def uptime(self) -> float:
        """Seconds since the simulated node booted (the spec's `uptime_s` at start)."""
        return self.spec.uptime_s + self.nvml.now()

    def check_probes(self) -> Probes:
        """What a one-shot check measures with: the simulated probes and the machine's
        kernel log, read from the start (an agent opens its own, see `adapt`)."""
        return replace(self.probes(), kernel_log=self.kernel_log_source())

    def check_context(self, config: Config, gpus: GpuSource,
                      peers: Sequence[Peer] = ()) -> CheckContext:
        """A one-shot run's context on this machine: the config's node name and GPU
        count, else the machine's own (it should have all its GPUs)."""
        expected = self.spec.gpus.count if config.expected_gpus is None else config.expected_gpus
        return CheckContext(catalog=config.catalog(), node_name=config.node_name or self.node,
                            gpus=gpus, expected_gpus=expected, peers=peers,
                            namespace=config.namespace)

    def prepare(self, planned: Sequence[Planned]) -> list[Planned]:
        """The planned checks (built with `check_probes`) pointed at the simulated
        DCGM, and replayable: what the recording holds no input for is SKIPPED."""
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
        agent = config.agent.model_copy(update={"kernel_log": self._kernel_log_settings(
            config.agent.kernel_log)})
        return config.model_copy(update={"checks": checks, "expected_gpus": expected,
                                         "agent": agent})

    def _kernel_log_settings(self, given: KernelLogSettings) -> KernelLogSettings:
        """The machine's kernel log and a position file beside it, unless the config
        names its own (a test that restarts the agent on one log)."""
        log = self.kernel_log
        if log is None or self.workdir is None:
            return given.model_copy(update={"enabled": False})
        default = KernelLogSettings()
        update = {}
        if given.path == default.path:
            update["path"] = str(log.path)
        if given.state_file == default.state_file:
            update["state_file"] = str(self.workdir / "kmsg-position.json")
        return given.model_copy(update=update)

    def _dcgmi(self) -> list[str]:
        dcgm = self.spec.dcgm
        if not self.spec.driver_present:  # no driver: DCGM cannot run either
            dcgm = NO_DRIVER_DCGM
        return fake_dcgmi_command(dcgm)

    def _simulated(self, item: Planned) -> Planned:
        if isinstance(item.check, DcgmCheck):
            params = {**item.check.params.model_dump(), "command": self._dcgmi()}
            return replace(item, check=DcgmCheck(params, probes=item.check.probes))
        return item


@contextmanager
def simulate(source: str | Path | MachineSpec,
             control: str | Path | None = None) -> Iterator[SimulatedNode]:
    """Install the simulated machine for the duration of the block. Without `control`
    the machine starts now and its files are gone after; with it, it is the machine
    that control file names (healthd.sim.shared: its clock and files outlive the
    process), and the file's changes are followed meanwhile (healthd.sim.control)."""
    try:
        spec = source if isinstance(source, MachineSpec) else load_machine_spec(source)
    except MachineSpecError as exc:
        raise SimulationError(str(exc)) from exc
    with ExitStack() as stack:
        if control is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="healthd-sim-")))
            elapsed = 0.0
        else:
            shared = shared_machine(Path(control), spec)
            workdir, elapsed = shared.root, shared.elapsed()
        fake = stack.enter_context(install(spec, clock=monotonic_clock(elapsed)))
        probe = SimBandwidthProbe(spec, clock=fake.clock, faults=fake.faults_for)
        node = SimulatedNode(spec, fake, probe)
        node.start_files(workdir)
        if control is not None:
            stack.enter_context(ControlFile(Path(control), node))
        yield node
