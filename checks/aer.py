"""The `aer` check: PCIe Advanced Error Reporting counters of each GPU's PCI path.

The kernel counts the PCIe errors each device reports (AER) in sysfs:
`/sys/bus/pci/devices/<address>/aer_dev_correctable`, `aer_dev_nonfatal` and
`aer_dev_fatal`, one `<name> <count>` line per error type (`RxErr`, `BadTLP`,
`CmpltTO`, `SDES`, ...) and a `TOTAL_ERR_*` line. An error on a link is often
reported by its other end, so each GPU's path is read: its own function (its
address from the round's NVML pass) and every bridge above it up to the root port,
found by resolving the device's sysfs link (`/sys/bus/pci/devices/0000:18:00.0` ->
`/sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0`).

Growth between two runs is judged (the first run only takes the baseline; a count
that went back, a device reset or re-enumerated, starts a new one):

- a fatal count that grows: PCIE_AER_FATAL (the link failed; the kernel resets it);
- a non-fatal (uncorrectable) count that grows: PCIE_AER_NONFATAL (a transaction
  was lost or poisoned);
- correctable errors faster than `max_correctable_per_min`: PCIE_AER_CORRECTABLE,
  a marginal link, damped like PCIE_REPLAYS (2 of 3 runs).

A finding is about the GPU whose path holds the device, and names the device and
the error types that grew; a bridge above several GPUs is reported on each. Counters
that cannot be read (no AER capability, AER off, no permission, no such device) make
the GPU SKIPPED with the reason, never PASS. Why each code has its severity:
docs/checks.md.

A check of its own, not part of `pcie`: it reads sysfs, not NVML, it sees the
bridges NVML does not, and it can be off (or not recorded) where sysfs is not the
host's while `pcie` still runs.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import anyio.to_thread
from pydantic import BaseModel, ConfigDict, Field

from checks.base import CheckContext, Entity, Measure, ResultBuilder, boot_uptime
from checks.gpucheck import GpuCheck
from checks.probes import AER_KINDS, AerCounters, AerKind, PciPath, Probes
from checks.snapshot import GpuSnapshot, NodeSnapshot

SYSFS_PCI_DEVICES = Path("/sys/bus/pci/devices")
AER_FILES: dict[AerKind, str] = {"correctable": "aer_dev_correctable",
                                 "nonfatal": "aer_dev_nonfatal", "fatal": "aer_dev_fatal"}
_ADDRESS = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_NVML_BUS_ID = re.compile(
    r"^(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])$")
NO_AER = "no AER capability (no aer_dev_* files)"


def sysfs_address(bus_id: str) -> str:
    """sysfs's name of a PCI function from NVML's bus id (`00000000:18:00.0` ->
    `0000:18:00.0`); "" when it is not one."""
    m = _NVML_BUS_ID.match(bus_id.strip())
    if m is None:
        return ""
    domain, bus, device, function = m.groups()
    return f"{int(domain or '0', 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}.{function}"


def parse_aer(text: str) -> dict[str, int]:
    """`<name> <count>` lines (names may hold spaces on older kernels) as a mapping."""
    counts: dict[str, int] = {}
    for line in text.splitlines():
        if line.strip():
            name, _, count = line.strip().rpartition(" ")
            counts[name.strip() or count] = int(count)  # a bare word: int() refuses it
    return counts


class _Unreadable(Exception):
    """One device's counters cannot be read; the text says why."""


@dataclass(frozen=True)
class SysfsAerReader:
    """The real reader: `<root>/<address>` (a link into the device tree) and the
    bridges above it. Each device is read once per call, however many GPUs share it."""

    root: Path = SYSFS_PCI_DEVICES

    def read(self, devices: Sequence[str]) -> dict[str, PciPath]:
        seen: dict[Path, AerCounters | str] = {}
        return {device: self._path(device, seen) for device in devices}

    def _path(self, device: str, seen: dict[Path, AerCounters | str]) -> PciPath:
        try:
            own = (self.root / device).resolve(strict=True)
        except (OSError, RuntimeError):
            return PciPath(missing=f"no PCI device {device} in {self.root}")
        chain = [own, *itertools.takewhile(lambda p: _ADDRESS.match(p.name), own.parents)]
        for node in chain:
            if node not in seen:
                seen[node] = _counters_or_reason(node)
        return PciPath(
            devices=tuple(node.name for node in chain),
            counters={n.name: c for n in chain if isinstance(c := seen[n], AerCounters)},
            unreadable={n.name: r for n in chain if isinstance(r := seen[n], str)})


def _counters_or_reason(device: Path) -> AerCounters | str:
    try:
        return AerCounters({kind: _read_counts(device / name) for kind, name in AER_FILES.items()})
    except _Unreadable as exc:
        return str(exc)


def _read_counts(path: Path) -> dict[str, int]:
    try:
        return parse_aer(path.read_text())
    except FileNotFoundError as exc:
        raise _Unreadable(NO_AER) from exc
    except PermissionError as exc:
        raise _Unreadable(f"{path.name}: permission denied") from exc
    except OSError as exc:
        raise _Unreadable(f"{path.name}: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise _Unreadable(f"{path.name}: not in the kernel's format ({exc})") from exc


class AerParams(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    sysfs_root: str = Field(str(SYSFS_PCI_DEVICES), description="where the PCI devices are")
    max_correctable_per_min: float = Field(
        8.0, ge=0, description="correctable errors per minute (on any device of a GPU's "
        "path) above which PCIE_AER_CORRECTABLE")


@dataclass(frozen=True)
class _Seen:
    counters: AerCounters
    at: float  # seconds since boot


@dataclass(frozen=True)
class _Growth:
    """What one device's counters of one kind did since the last run."""

    total: int
    named: Mapping[str, int]
    elapsed_s: float

    def listed(self) -> str:
        grown = [f"{name} +{n}" for name, n in sorted(self.named.items()) if n > 0]
        return ", ".join(grown) or f"+{self.total}"


_CODES: dict[AerKind, str] = {"fatal": "PCIE_AER_FATAL", "nonfatal": "PCIE_AER_NONFATAL",
                              "correctable": "PCIE_AER_CORRECTABLE"}
_BY_GRAVITY: tuple[AerKind, ...] = ("fatal", "nonfatal", "correctable")


class AerCheck(GpuCheck[AerParams]):
    NAME: ClassVar[str] = "aer"
    DESCRIPTION: ClassVar[str] = (
        "PCIe AER error counters of each GPU and the bridges above it (sysfs)")
    INPUTS: ClassVar[frozenset[str] | None] = frozenset({"nvml", "aer"})
    MEASURES: ClassVar[tuple[Measure, ...]] = tuple(
        Measure("healthd_gpu_pcie_aer_errors", "PCIe AER errors the kernel counted since "
                "boot on the GPU's function (where=gpu) and the bridges above it "
                "(where=upstream), by kind.", f"aer_{where}{kind}",
                extra=(("kind", kind), ("where", where.strip("_") or "gpu")))
        for where in ("", "upstream_") for kind in AER_KINDS)
    CODES: ClassVar[tuple[str, ...]] = tuple(_CODES.values())
    Params: ClassVar[type[BaseModel]] = AerParams
    DEFAULT_INTERVAL_S: ClassVar[float] = 30.0
    DEFAULT_TIMEOUT_S: ClassVar[float] = 10.0

    def __init__(self, params: BaseModel | Mapping[str, Any] | None = None, *,
                 probes: Probes | None = None) -> None:
        super().__init__(params, probes=probes)
        self._last: dict[str, _Seen] = {}  # per PCI device: the last run's counters
        self._paths: Mapping[str, PciPath] = {}  # this run's, per GPU address
        self._growth: dict[str, dict[AerKind, _Growth]] = {}  # this run's, per device

    async def examine(self, snapshot: NodeSnapshot, ctx: CheckContext,
                      builder: ResultBuilder) -> None:
        reader = self.probes.aer or SysfsAerReader(Path(self.settings.sysfs_root))
        wanted = [a for g in snapshot.gpus if (a := sysfs_address(g.pci_bus_id))]
        self._paths = await anyio.to_thread.run_sync(reader.read, wanted)
        self._growth = self._grow(self._paths.values(), (self.probes.uptime or boot_uptime)())
        await super().examine(snapshot, ctx, builder)

    def _grow(self, paths: Iterable[PciPath], now: float) -> dict[str, dict[AerKind, _Growth]]:
        """Each device's growth since the last run, once however many paths hold it;
        a device not read this time is forgotten (it starts a new baseline)."""
        last, self._last = self._last, {}
        growth: dict[str, dict[AerKind, _Growth]] = {}
        for path in paths:
            for device, counters in path.counters.items():
                if device in self._last:
                    continue
                self._last[device] = _Seen(counters, now)
                before = last.get(device)
                if before is not None and not _went_back(before.counters, counters):
                    growth[device] = _grown(before, counters, now)
        return growth

    def lost(self, gpu: GpuSnapshot, entity: Entity, builder: ResultBuilder) -> None:
        """A GPU NVML lost is still on its PCI path (the `gpus` check reports the loss):
        a fatal error above it says why it fell off the bus."""
        if sysfs_address(gpu.pci_bus_id) in self._paths:
            self.judge(gpu, entity, builder)
        else:  # lost before NVML could name its address
            super().lost(gpu, entity, builder)

    def judge(self, gpu: GpuSnapshot, entity: Entity, builder: ResultBuilder) -> None:
        address = sysfs_address(gpu.pci_bus_id)
        path = self._paths.get(address)
        if path is None or path.missing:
            builder.skip(entity, f"PCIe AER: {path.missing if path else 'no PCI bus id'}")
            return
        if not path.counters:
            builder.skip(entity, f"PCIe AER: no counters on {_where(path, 0)} "
                         f"or the {len(path.devices) - 1} bridges above it: "
                         f"{path.unreadable.get(address, NO_AER)}")
            return
        builder.seen(entity, **_values(path))
        for kind in _BY_GRAVITY:
            self._judge_kind(kind, path, entity, builder)

    def _judge_kind(self, kind: AerKind, path: PciPath, entity: Entity,
                    builder: ResultBuilder) -> None:
        grown = [(level, g) for level, device in enumerate(path.devices)
                 if (g := self._growth.get(device, {}).get(kind)) is not None
                 and self._counts(kind, g)]
        if not grown:
            return
        total = sum(g.total for _, g in grown)
        where = "; ".join(f"{_where(path, level)}: {g.listed()}" for level, g in grown)
        if kind == "correctable":
            seconds = max(g.elapsed_s for _, g in grown)
            message = (f"PCIe AER: {total} correctable errors in {seconds:.0f} s (tolerated "
                       f"{self.settings.max_correctable_per_min:g} a minute): {where}")
        else:
            message = f"PCIe AER: {total} new {kind} error(s) since the last run: {where}"
        builder.finding(_CODES[kind], entity, message, **{f"aer_{kind}_delta": total})

    def _counts(self, kind: AerKind, growth: _Growth) -> bool:
        """Whether this growth is a finding: any fatal or non-fatal error; correctable
        ones above the rate, over at least a minute (two runs close together, an
        on-demand run after a periodic one, are held to a whole minute's budget)."""
        if kind != "correctable":
            return growth.total > 0
        minutes = max(growth.elapsed_s / 60, 1.0)
        return growth.total > self.settings.max_correctable_per_min * minutes


def _went_back(before: AerCounters, now: AerCounters) -> bool:
    return any(now.total(kind) < before.total(kind) for kind in AER_KINDS)


def _grown(before: _Seen, counters: AerCounters, now: float) -> dict[AerKind, _Growth]:
    out: dict[AerKind, _Growth] = {}
    for kind in AER_KINDS:
        total = counters.total(kind) - before.counters.total(kind)
        if total > 0:
            old = before.counters.named(kind)
            named = {k: v - old.get(k, 0) for k, v in counters.named(kind).items()}
            out[kind] = _Growth(total, named, now - before.at)
    return out


def _where(path: PciPath, level: int) -> str:
    """`GPU 0000:18:00.0`, `bridge 0000:17:00.0`, `root port 0000:15:01.0`."""
    device = path.devices[level]
    if level == 0:
        return f"GPU {device}"
    return f"{'root port' if level == len(path.devices) - 1 else 'bridge'} {device}"


def _values(path: PciPath) -> dict[str, int | str]:
    """The GPU function's totals, its bridges' summed, the path (root port first) and
    the devices without counters."""
    values: dict[str, int | str] = {}
    own = path.counters.get(path.devices[0])
    bridges = [path.counters[d] for d in path.devices[1:] if d in path.counters]
    if own is not None:
        values.update({f"aer_{kind}": own.total(kind) for kind in AER_KINDS})
    if bridges:
        values.update({f"aer_upstream_{kind}": sum(c.total(kind) for c in bridges)
                       for kind in AER_KINDS})
    values["pci_path"] = " > ".join(reversed(path.devices))
    if path.unreadable:
        values["aer_unreadable"] = ", ".join(d for d in path.devices if d in path.unreadable)
    return values
