"""The simulated bandwidth measurement: what the pciebw check measures on a machine
described by a spec, in place of the CUDA driver, in a child process as on a real node.

`SimBandwidthProbe` is the real `checks.pciebw_probe.ChildBandwidthProbe` with another
child: for each GPU it works out what the spec says the GPU measures now, and runs
healthd.sim.cuda_child, which holds a host buffer of the copy's size (as the real
child holds its pinned buffer) and answers that in the real child's format. So the
parent's side (spawn, deadline, parse, a child that dies) runs for real. Per GPU, per
direction, the reported GB/s is, in order of precedence:

1. the last active fault's `pcie_bandwidth_gbps` for that direction;
2. the spec's `gpus.pcie_bandwidth_gbps` for that direction;
3. 85% of what the GPU's CURRENT link carries (after any active `pcie` link fault),
   which is what healthy hardware achieves with pinned copies;

less, on a GPU with an active `busy` fault, the traffic that workload makes in that
direction (the two share the link), never below 5% of it.

Faults are active between `at` and `until` seconds after the machine starts (the
rules live in healthd.sim.gpustate). A GPU that is lost or missing, or a machine
whose driver is absent, fails the way the CUDA driver would, with the same messages.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from checks import cuda_child
from checks.cuda import CUDA_NOT_FOUND, CudaError, parse_bus_id
from checks.pciebw import link_rate_gbps
from checks.pciebw_probe import ChildBandwidthProbe, ProbeError, ProbeUnavailable
from checks.probes import Bandwidth
from healthd.sim.fakenvml import Clock, monotonic_clock
from healthd.sim.gpustate import GpuState, gpu_state, is_active
from healthd.sim.machine import GpuFault, MachineSpec

HEALTHY_EFFICIENCY = 0.85
LEAST_SHARE = 0.05  # a busy link still moves this much of the probe's copies
CHILD_MODULE = "healthd.sim.cuda_child"
_CUDA_ERROR_UNKNOWN = 999  # what CUDA answers for a GPU that fell off the bus


class SimBandwidthProbe(ChildBandwidthProbe):
    """Bandwidth as the machine spec says, at the time `clock` gives, measured in a
    child process (see the module docstring).

    `clock` returns seconds since the machine started (share the fake NVML library's
    clock so both see the same faults); None counts from the moment the probe is made.
    `faults(gpu)` lists the faults on a GPU, for a machine whose faults change while
    it runs; by default, the spec's."""

    def __init__(
        self,
        spec: MachineSpec,
        clock: Clock | None = None,
        *,
        faults: Callable[[int], Sequence[GpuFault]] | None = None,
    ) -> None:
        super().__init__(self._child)
        self.spec = spec
        self._clock = clock or monotonic_clock()
        self._faults = faults or spec.faults_for

    def _child(self, pci_bus_id: str, size_bytes: int, iterations: int) -> list[str]:
        """The child that answers what this GPU measures now."""
        try:
            rates = self.rates(pci_bus_id, size_bytes, iterations)
            answer = cuda_child.Answer(rates.h2d_gbps, rates.d2h_gbps)
        except ProbeError as exc:
            answer = cuda_child.Answer(error=exc.reason,
                                       unavailable=isinstance(exc, ProbeUnavailable))
        return cuda_child.command(CHILD_MODULE, str(max(0, size_bytes)),
                                  cuda_child.encode(answer))

    def rates(self, pci_bus_id: str, size_bytes: int, iterations: int) -> Bandwidth:
        """What the GPU at `pci_bus_id` measures now (ProbeError, ProbeUnavailable as
        the CUDA driver would fail)."""
        if not self.spec.driver_present:
            raise ProbeUnavailable(CUDA_NOT_FOUND)
        if size_bytes <= 0 or iterations <= 0:
            raise ProbeError(f"nothing to copy: {size_bytes} bytes x {iterations}")
        t = self._clock()
        index = self._index(pci_bus_id)
        faults = self._faults(index)
        state = gpu_state(self.spec, faults, index, t)
        _fail_like_cuda(state)
        return self._bandwidth(state, faults, t)

    def _index(self, pci_bus_id: str) -> int:
        wanted = parse_bus_id(pci_bus_id)
        for index in range(self.spec.gpus.count):
            if wanted is not None and parse_bus_id(self.spec.pci_bus_id(index)) == wanted:
                return index
        raise ProbeError(f"no CUDA device at PCI bus id {pci_bus_id}")

    def _bandwidth(self, state: GpuState, faults: Sequence[GpuFault], t: float) -> Bandwidth:
        h2d, d2h = self.spec.gpus.pcie_bandwidth_gbps.h2d, self.spec.gpus.pcie_bandwidth_gbps.d2h
        for fault in faults:  # the last active fault listed wins, direction by direction
            if fault.pcie_bandwidth_gbps is not None and is_active(fault, t):
                h2d = fault.pcie_bandwidth_gbps.h2d or h2d
                d2h = fault.pcie_bandwidth_gbps.d2h or d2h
        healthy = HEALTHY_EFFICIENCY * link_rate_gbps(state.pcie_gen, state.pcie_width)
        h2d, d2h = h2d or healthy, d2h or healthy
        if state.busy is not None:  # the workload's copies share the link with ours
            h2d = max(h2d - state.busy.pcie_rx_gbps, h2d * LEAST_SHARE)
            d2h = max(d2h - state.busy.pcie_tx_gbps, d2h * LEAST_SHARE)
        return Bandwidth(h2d, d2h)


def _fail_like_cuda(state: GpuState) -> None:
    """Raise what the CUDA driver would for a GPU that cannot be measured."""
    if state.missing:
        raise ProbeError(f"no CUDA device at PCI bus id {state.pci_bus_id}")
    if state.lost:
        lost = CudaError.from_result("cuDevicePrimaryCtxRetain", _CUDA_ERROR_UNKNOWN)
        raise ProbeError(str(lost))
    if state.mig:
        raise ProbeError("MIG enabled: the whole GPU cannot be measured")
