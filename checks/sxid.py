"""The `sxid` check: NVSwitch errors (SXIDs) from the kernel log, per NVSwitch.

Only the NVSwitch driver reports SXIDs, and only in the kernel log
(`nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 ...`); NVML
has no event for them. Each run takes the SXID lines logged since the last one
(checks.kernel_log keeps the position across restarts) and reports one finding per
NVSwitch and code, with how many lines carried it:

- `SXID_<n>` with the catalog's severity (checks.catalog: NVIDIA's published fatal,
  always-fatal and non-fatal lists). A fatal SXID is a sticky EVICT: NVLink traffic
  through the switch stops, running multi-GPU work hangs or fails, and only a reset
  of the board's GPUs and NVSwitches (a host restart) recovers it;
- an SXID the catalogue does not list but the driver logged as "Fatal" is
  `SXID_FATAL` (the same sticky EVICT).

The check judges NVSwitch systems only: like the other GPU checks it needs the NVML
pass (no driver -> UNKNOWN), and where no GPU is in an NVLink fabric it is SKIPPED.
No kernel log (none configured, or no /dev/kmsg in the pod) -> SKIPPED; a replay of
a recording without one -> SKIPPED "not recorded"; a log that cannot be read (no
CAP_SYSLOG under kernel.dmesg_restrict=1) -> UNKNOWN.
"""

from __future__ import annotations

from typing import ClassVar

import anyio.to_thread

from checks.base import CheckContext, Counted, Entity, EventRun, NoParams, ResultBuilder
from checks.catalog import SXID_FATAL, is_fatal_sxid
from checks.gpucheck import GpuCheck
from checks.kernel_log import LogUnavailable, NoLog, NotRecorded
from checks.probes import LoggedSxid
from checks.snapshot import NodeSnapshot, Ok


class SxidCheck(GpuCheck[NoParams]):
    NAME: ClassVar[str] = "sxid"
    INPUTS: ClassVar[frozenset[str] | None] = frozenset({"nvml", "kernel_log"})
    DESCRIPTION: ClassVar[str] = "NVSwitch errors (SXIDs) in the kernel log"
    CODES: ClassVar[tuple[str, ...]] = ("SXID_*", "SXID_FATAL")
    DEFAULT_INTERVAL_S: ClassVar[float] = 30.0
    DEFAULT_TIMEOUT_S: ClassVar[float] = 10.0
    # NVML has no event for SXIDs: the agent runs the check when the log has one.
    EVENTS: ClassVar[EventRun | None] = EventRun("kernel-log", lines="sxid")
    COUNTS: ClassVar[tuple[Counted, ...]] = (
        Counted("healthd_nvswitch_sxid_events_total", "NVSwitch SXID errors logged, by code.",
                "sxid", kind="nvswitch"),)

    async def examine(self, snapshot: NodeSnapshot, ctx: CheckContext,
                      builder: ResultBuilder) -> None:
        """Judge the SXIDs logged since the last run, on NVSwitch systems only (a GPU
        in an NVLink fabric says there is one): elsewhere the log has nothing to say
        and reading it would pass a node nothing was measured on."""
        node = Entity.node(ctx.node_name)
        if not any(isinstance(gpu.fabric, Ok) for gpu in snapshot.gpus):
            builder.skip(node, "no NVSwitch fabric: no GPU is in an NVLink fabric")
            return
        log = self.probes.kernel_log
        if log is None:
            builder.skip(node, "no kernel log to read")
            return
        try:
            logged = await anyio.to_thread.run_sync(log.take, "sxid")
        except (NotRecorded, NoLog) as exc:
            builder.skip(node, str(exc))
            return
        except LogUnavailable as exc:
            builder.unknown(node, str(exc))
            return
        groups: dict[tuple[Entity, str], list[LoggedSxid]] = {}
        for line in logged:
            if isinstance(line, LoggedSxid):
                groups.setdefault((_switch(line), sxid_code(line)), []).append(line)
        for (switch, code), lines in groups.items():
            link = {"link": lines[0].link} if lines[0].link is not None else {}
            builder.finding(code, switch, _message(lines), sxid=lines[0].sxid,
                            count=len(lines), **link)


def sxid_code(line: LoggedSxid) -> str:
    """The finding code of one SXID line (see the module docstring)."""
    if line.fatal and not is_fatal_sxid(line.sxid):
        return SXID_FATAL  # the driver's word wins over a list that may be older
    return f"SXID_{line.sxid}"


def _switch(line: LoggedSxid) -> Entity:
    return Entity("nvswitch", line.switch, pci_bus_id=line.pci)


def _message(lines: list[LoggedSxid]) -> str:
    """`fatal SXID 24007: Link 28 sourcetrack timeout error (First)`: the driver's own
    description, after the code and its severity word."""
    first = lines[0]
    fatal = "fatal " if first.fatal else ""
    times = f" ({len(lines)} lines)" if len(lines) > 1 else ""
    return f"{fatal}SXID {first.sxid}: {first.message.split(', ', 2)[-1]}{times}"
