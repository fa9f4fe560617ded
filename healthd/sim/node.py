"""A simulated GPU node: the fake NVML library under the real pynvml, the simulated
bandwidth probe, the fake dcgmi and a kernel-log file, all from one machine spec.

`healthd check --sim SPEC` builds its checks with the machine's stand-ins
(`check_probes`) and prepares them (`prepare`: a recording's checks whose inputs it
does not hold are SKIPPED, healthd.sim.recorded); an agent on the simulated machine
is built from the adapted config (`adapt`) and handed the simulated probes
(`probes`), so the product never knows it is simulated.

Where a config names a path of its own, the simulation honours it as a node would:
the kernel log (`agent.kernel_log.path`, `state_file`) and the RDMA sysfs root
(`checks.rdma.params.sysfs_root`) are the machine's files only when the config
leaves them at their defaults.
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import checks as registry
from checks.base import CheckContext, Peer
from checks.dcgm import DcgmCheck
from checks.kernel_log import KernelLog
from checks.probes import AerReader, GpuSource, KernelLogSource, Probes, RdmaReader
from checks.rdma import SYSFS_INFINIBAND, RdmaCheck, SysfsRdmaReader
from healthd.check.plans import Planned
from healthd.config import Config
from healthd.config.agent import KernelLogSettings
from healthd.sim.aer import NotRecordedAer, SimAer, SimAerReader
from healthd.sim.control import ControlFile, apply
from healthd.sim.cuda import SimBandwidthProbe
from healthd.sim.dcgm import DcgmSim, fake_dcgmi_command
from healthd.sim.fakenvml import FakeNvml, install, monotonic_clock
from healthd.sim.holders import MachineHolders, NvmlSessions, SimDeviceUsers
from healthd.sim.kernellog import NotRecordedLog, SimKernelLog
from healthd.sim.machine import MachineSpec, MachineSpecError, RdmaSpec, load_machine_spec
from healthd.sim.network import SimNetwork
from healthd.sim.nvidia_smi import command as nvidia_smi_command
from healthd.sim.rdma import NotRecordedRdma, SimRdma
from healthd.sim.recorded import missing_inputs, replayable
from healthd.sim.shared import shared_machine

log = logging.getLogger(__name__)

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
    aer: SimAer | None = None  # the fake /sys/bus/pci/devices (None: not recorded)
    control: Path | None = None  # the control file that names the machine, if any
    holders: MachineHolders = field(init=False)  # what holds its GPUs (healthd.sim.holders)
    follower: ControlFile | None = None  # what follows the control file, when one does

    def __post_init__(self) -> None:
        self.holders = MachineHolders(self.spec, self.nvml.clock, self.nvml.library.registry)

    def follow(self, follower: ControlFile) -> None:
        """Share the machine's changes with its other processes through `follower`'s
        control file (NVML's included: persistence mode)."""
        self.follower = follower
        self.nvml.library.publish = follower.change

    def change(self, command: dict[str, Any]) -> None:
        """A control-file command (healthd.sim.control) on this machine: for every
        process on it when it is shared, else here (ValueError for a bad one)."""
        if self.follower is not None:
            self.follower.change(command)
        else:
            apply(self, json.dumps(command))

    def device_users(self) -> SimDeviceUsers:
        """Who has the machine's GPU device files open, as /proc would show it."""
        return SimDeviceUsers(self.holders, self.nvml.state)

    def start_files(self, workdir: Path) -> None:
        """Write the machine's files under `workdir`: its kernel log's history (unless
        an earlier process on this machine did), its RDMA ports and its PCI tree."""
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        if self.spec.holds("kernel_log"):
            self.kernel_log = SimKernelLog(workdir / "kmsg", self.uptime)
            if self.kernel_log.empty:
                self.kernel_log.write_history(self.spec.kernel_log or [])
        if self.spec.holds("rdma"):
            self.rdma = SimRdma(workdir / "infiniband", self.spec.rdma or RdmaSpec())
        if self.spec.holds("aer"):
            self.aer = SimAer(workdir / "pci", self.spec, self.nvml.clock, self.nvml.faults_for)

    def rdma_reader(self) -> RdmaReader | None:
        """The machine's RDMA ports as sysfs shows them: its fake tree (None: no
        files), what the recorder reads. The rdma check reads its own `sysfs_root`,
        which `adapt` and `prepare` point at this tree (see `_rdma_root`)."""
        if self.workdir is None:
            return None
        if self.rdma is None:
            return NotRecordedRdma()
        return SysfsRdmaReader(self.rdma.root)

    def aer_reader(self) -> AerReader | None:
        """The aer check's reader: the machine's fake PCI tree (None: no files)."""
        if self.workdir is None:
            return None
        if self.aer is None:
            return NotRecordedAer()
        return SimAerReader(self.aer)

    def _rdma_probe(self) -> RdmaReader | None:
        """The agent's rdma probe: none, so the check reads its `sysfs_root`, unless the
        recording holds no ports (then every read says "not recorded")."""
        return NotRecordedRdma() if self.workdir is not None and self.rdma is None else None

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
            return Probes(bandwidth=self.bandwidth, uptime=self.uptime, rdma=self._rdma_probe(),
                          aer=self.aer_reader())
        return Probes(bandwidth=self.bandwidth, links=self.network.links(self.spec.node),
                      ping=self.network.prober(self.spec.node), uptime=self.uptime,
                      rdma=self._rdma_probe(), aer=self.aer_reader())

    def uptime(self) -> float:
        """Seconds since the simulated node booted (the spec's `uptime_s` at start)."""
        return self.spec.uptime_s + self.nvml.now()

    def check_probes(self) -> Probes:
        """What a one-shot check (or the recorder) measures with: the simulated probes,
        the machine's kernel log, read from the start (an agent opens its own, see
        `adapt`), and its RDMA ports (`prepare` lets a config's own root win)."""
        return replace(self.probes(), kernel_log=self.kernel_log_source(),
                       rdma=self.rdma_reader())

    def check_context(self, config: Config, gpus: GpuSource,
                      peers: Sequence[Peer] = ()) -> CheckContext:
        """A one-shot run's context on this machine: the config's node name and GPU
        count, else the machine's own (it should have all its GPUs)."""
        expected = self.spec.gpus.count if config.expected_gpus is None else config.expected_gpus
        return CheckContext(catalog=config.catalog(), node_name=config.node_name or self.node,
                            gpus=gpus, expected_gpus=expected, peers=peers,
                            namespace=config.probe_namespace)

    def prepare(self, planned: Sequence[Planned]) -> list[Planned]:
        """The planned checks (built with `check_probes`) pointed at the simulated
        DCGM and RDMA sysfs tree, and replayable: what the recording holds no input for
        is SKIPPED."""
        return [replayable(self.spec, self._simulated(item)) for item in planned]

    def adapt(self, config: Config) -> Config:
        """`config` for an agent on this machine: `dcgmi` is the fake one, the rdma
        check reads the machine's sysfs tree (unless the config names its own), the
        machine should have all its GPUs (unless the config says how many), and the
        checks a recording holds no inputs for are off (they would invent results)."""
        dcgm = config.check_section("dcgm")
        params = {**dcgm.params, "command": self._dcgmi()}
        checks = {**config.checks, "dcgm": dcgm.model_copy(update={"params": params})}
        if self.rdma is not None:
            rdma = config.check_section("rdma")
            root = self._rdma_root(str(rdma.params.get("sysfs_root", SYSFS_INFINIBAND)))
            checks["rdma"] = rdma.model_copy(
                update={"params": {**rdma.params, "sysfs_root": root}})
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

    def nvidia_smi(self) -> list[str]:
        """The command standing in for `nvidia-smi` here (healthd.sim.nvidia_smi): it
        resets GPUs of the machine the control file names (without one, of a machine
        of its own in this machine's files)."""
        control = self.control
        if control is None:
            assert self.workdir is not None
            control = self.workdir / "nvidia-smi-control"
            shared_machine(control, self.spec)
        return nvidia_smi_command(control)

    def _rdma_root(self, configured: str) -> str:
        """Where the rdma check reads sysfs on this machine: the machine's tree, unless
        the config names a root of its own (`checks.rdma.params.sysfs_root`), which is
        honoured as on a node: a tree the test prepared and changes itself."""
        assert self.rdma is not None
        if configured == str(SYSFS_INFINIBAND):
            return str(self.rdma.root)
        if self.spec.rdma is not None:
            log.warning("the rdma check reads checks.rdma.params.sysfs_root (%s), not the "
                        "machine spec's rdma section", configured)
        return configured

    def _simulated(self, item: Planned) -> Planned:
        check = item.check
        if isinstance(check, DcgmCheck):
            params = {**check.params.model_dump(), "command": self._dcgmi()}
            return replace(item, check=DcgmCheck(params, probes=check.probes))
        if isinstance(check, RdmaCheck) and self.rdma is not None:
            params = {**check.params.model_dump(),
                      "sysfs_root": self._rdma_root(check.params.sysfs_root)}
            return replace(item, check=RdmaCheck(params, probes=replace(check.probes, rdma=None)))
        return item


@contextmanager
def simulate(source: str | Path | MachineSpec,
             control: str | Path | None = None) -> Iterator[SimulatedNode]:
    """Install the simulated machine for the duration of the block. Without `control`
    the machine starts now and its files are gone after; with it, it is the machine
    that control file names (healthd.sim.shared: its clock and files outlive the
    process), the file's changes are followed meanwhile (healthd.sim.control), and what
    this process holds of NVML is written beside it (healthd.sim.holders)."""
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
        registered = None if control is None else NvmlSessions(workdir)
        fake = stack.enter_context(install(spec, clock=monotonic_clock(elapsed),
                                           sessions=registered))
        probe = SimBandwidthProbe(spec, clock=fake.clock, faults=fake.faults_for)
        node = SimulatedNode(spec, fake, probe, control=None if control is None
                             else Path(control))
        node.start_files(workdir)
        if control is not None:
            follower = ControlFile(Path(control), node)
            node.follow(follower)
            stack.enter_context(follower)
        yield node
