"""Whether another workload shares a GPU, from what NVML says, and the words for it.

A node runs training jobs, and a job that copies host-to-device (every data loader
does) halves what a bandwidth probe measures beside it. pciebw never judges such a
measurement; it asks NVML, before and after each copy, two things (checks.probes'
`GpuActivity`, read by checks.nvml_reader):

- the compute and graphics processes holding a context on the GPU, the probe's own
  child excepted: a job always has one, even one that copies nothing now;
- the PCIe traffic of the GPU's link, each direction: catches traffic without a
  process on this GPU (peer-to-peer copies from another GPU's job, a NIC writing
  into its memory). Traffic of at least `traffic_gbps` in either direction is busy.

A GPU is busy on either. When NVML cannot list the processes, whether it is busy
cannot be told (`unsure`); unreadable traffic alone leaves the processes to decide.
"""

from __future__ import annotations

from dataclasses import dataclass

from checks.probes import GpuActivity

KB = 1000  # NVML counts PCIe throughput in KB/s, taken as decimal like the rates


@dataclass(frozen=True)
class Assessment:
    """What NVML's view of a GPU says: `busy` when others use it (`processes`, and the
    traffic in GB/s each direction), else whether it could tell (`unsure`: why not)."""

    processes: int = 0
    h2d_gbps: float = 0.0  # traffic the GPU receives: host-to-device
    d2h_gbps: float = 0.0
    busy: bool = False
    unsure: str = ""

    def evidence(self) -> str:
        """`1 process, 24.8 GB/s other H2D traffic` (what made it busy)."""
        parts = []
        if self.processes:
            parts.append(f"{self.processes} process{'es' if self.processes != 1 else ''}")
        for name, gbps in (("H2D", self.h2d_gbps), ("D2H", self.d2h_gbps)):
            if gbps:
                parts.append(f"{gbps:.1f} GB/s other {name} traffic")
        return ", ".join(parts)


def assess(activity: GpuActivity, *, traffic_gbps: float, probe_pid: int = 0) -> Assessment:
    """Judge one reading of a GPU's activity; `probe_pid`, the probe's own process,
    is not another workload."""
    others = None if activity.pids is None else [p for p in activity.pids if p != probe_pid]
    h2d, d2h = _gbps(activity.rx_kbps), _gbps(activity.tx_kbps)
    loud = {name: v for name, v in (("h2d", h2d), ("d2h", d2h)) if v >= traffic_gbps}
    busy = bool(others) or bool(loud)
    return Assessment(
        processes=len(others or ()),
        h2d_gbps=loud.get("h2d", 0.0),
        d2h_gbps=loud.get("d2h", 0.0),
        busy=busy,
        unsure="" if busy or others is not None else activity.problem or "processes unknown",
    )


def _gbps(kbps: int | None) -> float:
    return 0.0 if kbps is None else kbps * KB / 1e9
