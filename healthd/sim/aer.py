"""The simulated PCI tree: a fake `/sys/bus/pci/devices` in the machine's work
directory, read by the real sysfs reader (checks.aer.SysfsAerReader), written from the
machine spec's `aer` section and the GPUs' `aer` faults.

The layout is the kernel's: `root/devices/pci<domain>:<bus>/<root port>/<bridge>/.../
<GPU>`, each device with `aer_dev_correctable`, `aer_dev_nonfatal` and `aer_dev_fatal`
in the kernel's format (its error names in its order, then the `TOTAL_ERR_*` line),
and `root/bus/pci/devices/<address>`, a link to each device. The counters are the
spec's `counts` plus every `aer` fault whose `at` has passed on the machine's clock;
the files are brought up to that clock before each read (`SimAerReader`), so a test
bumps a counter while checks run by injecting a fault (`SimulatedNode.nvml.inject`),
and a spec's fault `at: 30` is seen by the first read after 30 s.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from checks.aer import AER_FILES, SysfsAerReader, sysfs_address
from checks.probes import AER_KINDS, AER_TOTALS, AerKind, PciPath
from healthd.sim.machine import AerCounts, GpuFault, MachineSpec

Counts = dict[AerKind, dict[str, int]]

# drivers/pci/pcie/aer.c: the names every aer_dev_* file lists, in the kernel's order.
_UNCORRECTABLE = ("Undefined", "DLP", "SDES", "TLP", "FCP", "CmpltTO", "CmpltAbrt", "UnxCmplt",
                  "RxOF", "MalfTLP", "ECRC", "UnsupReq", "ACSViol", "UncorrIntErr", "BlockedTLP",
                  "AtomicOpBlocked", "TLPBlockedErr", "PoisonTLPBlocked")
KERNEL_NAMES: dict[AerKind, tuple[str, ...]] = {
    "correctable": ("RxErr", "BadTLP", "BadDLLP", "Rollover", "Timeout", "NonFatalErr",
                    "CorrIntErr", "HeaderOF"),
    "nonfatal": _UNCORRECTABLE,
    "fatal": _UNCORRECTABLE,
}


class SimAer:
    """The fake PCI tree under `root`; `refresh()` writes the counters as they are
    at `clock()`, given the faults `faults(gpu)` returns (the fake NVML's, injected
    ones included)."""

    def __init__(self, root: Path, spec: MachineSpec, clock: Callable[[], float],
                 faults: Callable[[int], list[GpuFault]]) -> None:
        self.root = root
        self.devices = root / "bus" / "pci" / "devices"  # what the reader is pointed at
        self.spec = spec
        self._clock = clock
        self._faults = faults
        self._paths = {i: [a, *spec.pci_upstream(i)] for i in range(spec.gpus.count)
                       if (a := sysfs_address(spec.pci_bus_id(i)))}
        self._dirs: dict[str, Path] = {}
        self._written: dict[Path, str] = {}
        self.devices.mkdir(parents=True, exist_ok=True)
        for chain in self._paths.values():
            self._build(chain)
        self.refresh()

    def _build(self, chain: Sequence[str]) -> None:
        """Directories from the root bus down to the GPU, and a link to each."""
        top = chain[-1]
        where = self.root / "devices" / f"pci{top.rsplit(':', 1)[0]}"
        for device in reversed(chain):
            where = where / device
            if device not in self._dirs:
                where.mkdir(parents=True, exist_ok=True)
                link = self.devices / device
                if not link.is_symlink():  # an earlier process on this machine made it
                    link.symlink_to(where, target_is_directory=True)
                self._dirs[device] = where

    def refresh(self) -> None:
        """Write every device's aer_dev_* files as they are now (a changed one only)."""
        aer = self.spec.aer
        counts = self.counts()
        for device, where in self._dirs.items():
            if not aer.supported or device in aer.without_aer:
                continue
            for kind, name in AER_FILES.items():
                self._write(where / name, _file_text(kind, counts.get(device, {}).get(kind, {})))

    def counts(self) -> dict[str, Counts]:
        """Each device's counters now: the spec's since boot plus the faults that
        started, every source adding its own total."""
        out: dict[str, Counts] = {}
        for device, given in self.spec.aer.counts.items():
            _add(out.setdefault(device, {}), given)
        now = self._clock()
        for gpu, chain in self._paths.items():
            for fault in self._faults(gpu):
                if fault.at <= now:  # counters never go back: `until` changes nothing
                    for error in fault.aer:
                        _add(out.setdefault(chain[error.level], {}), error)
        return out

    def _write(self, path: Path, text: str) -> None:
        if self._written.get(path) != text:
            path.write_text(text)
            self._written[path] = text


def _add(into: Counts, counts: AerCounts) -> None:
    for kind in AER_KINDS:
        named: Mapping[str, int] = getattr(counts, kind)
        mine = into.setdefault(kind, {})
        total_name = AER_TOTALS[kind]
        total = named.get(total_name, sum(v for k, v in named.items() if k != total_name))
        for name, value in named.items():
            if name != total_name:
                mine[name] = mine.get(name, 0) + value
        mine[total_name] = mine.get(total_name, 0) + total


def _file_text(kind: AerKind, counts: Mapping[str, int]) -> str:
    """An aer_dev_* file: the kernel's names, any other named counter, the total."""
    total_name = AER_TOTALS[kind]
    names = [*KERNEL_NAMES[kind],
             *(n for n in counts if n not in KERNEL_NAMES[kind] and n != total_name)]
    lines = [f"{name} {counts.get(name, 0)}" for name in names]
    return "\n".join([*lines, f"{total_name} {counts.get(total_name, 0)}"]) + "\n"


class SimAerReader:
    """What the aer check reads on a simulated machine: the real reader over the fake
    tree, brought up to the machine's clock first."""

    def __init__(self, sim: SimAer) -> None:
        self.sim = sim

    def read(self, devices: Sequence[str]) -> Mapping[str, PciPath]:
        self.sim.refresh()
        return SysfsAerReader(self.sim.devices).read(devices)


class NotRecordedAer:
    """The PCI paths of a recording that holds none (checks.probes.AerReader)."""

    def read(self, devices: Sequence[str]) -> Mapping[str, PciPath]:
        return {device: PciPath(missing="not recorded") for device in devices}
