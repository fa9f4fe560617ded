"""The `xid` check: XID errors that NVML's event API delivers, per GPU.

XIDs are the driver's error reports. Each becomes a finding `XID_<n>` on its GPU
with the catalog's severity (so the config can override any XID): XID 79 (fallen off
the bus) is a sticky EVICT, application-caused XIDs (13, 31, 43, 45, ...) are PASS,
reported for the record but never raising the verdict.

The check is event-driven. One run collects the events of a short window
(`window_s`, for one-shot runs such as `healthd check xid`); the agent runs it at
once for every XID NVML delivers (its `EVENTS`), with no window of its own.

Where the context has a kernel log (checks.kernel_log), each run also takes the XID
lines logged since the last run, so an XID written while nobody listened (the agent
restarting or not yet started) gets the same finding as a live one. An XID both
sources report is counted once. An unreadable log leaves NVML's events alone and
says so in the node's values (`kernel_log`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import ClassVar

import anyio.to_thread
from pydantic import BaseModel, ConfigDict, Field

from checks.base import CheckContext, Counted, Entity, EventRun, Finding, ResultBuilder
from checks.gpucheck import GpuCheck, gpu_entity
from checks.kernel_log import LogUnavailable
from checks.probes import KernelLogSource, LoggedXid
from checks.snapshot import GpuSnapshot, NodeSnapshot, XidEvent

MAX_WINDOW_S = 10.0


class XidParams(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    window_s: float = Field(
        1.0, ge=0, le=MAX_WINDOW_S, description="how long one run listens for XID events"
    )


class XidCheck(GpuCheck[XidParams]):
    NAME: ClassVar[str] = "xid"
    DESCRIPTION: ClassVar[str] = "XID errors reported by the driver, with their catalog severity"
    CODES: ClassVar[tuple[str, ...]] = ("XID_*", "GPU_MISSING")
    Params: ClassVar[type[BaseModel]] = XidParams
    DEFAULT_INTERVAL_S: ClassVar[float] = 30.0
    INPUTS: ClassVar[frozenset[str] | None] = frozenset({"nvml", "xid"})
    EVENTS: ClassVar[EventRun | None] = EventRun("nvml-xid", listen="window_s")
    COUNTS: ClassVar[tuple[Counted, ...]] = (
        Counted("healthd_gpu_xid_events_total", "XID events received, by code.", "xid"),)
    # Must exceed the longest window plus one NVML pass.
    DEFAULT_TIMEOUT_S: ClassVar[float] = MAX_WINDOW_S + 10.0


    async def examine(
        self, snapshot: NodeSnapshot, ctx: CheckContext, builder: ResultBuilder
    ) -> None:
        await super().examine(snapshot, ctx, builder)
        assert ctx.gpus is not None  # run() answered UNKNOWN otherwise
        try:
            events = await ctx.gpus.xid_events(self.settings.window_s)
        except Exception as exc:  # the access layer should not raise; never crash if it does
            _all_unknown(snapshot.gpus, builder, f"cannot read XID events: {exc}")
            return
        events = await _with_kernel_log(events, snapshot, self.probes.kernel_log,
                                        Entity.node(ctx.node_name), builder)
        findings_for_xids(events, snapshot.gpus, builder)

    def judge(self, gpu: GpuSnapshot, entity: Entity, builder: ResultBuilder) -> None:
        """A GPU passes unless an event names it (see `findings_for_xids`)."""


async def _with_kernel_log(events: list[XidEvent], snapshot: NodeSnapshot,
                           log: KernelLogSource | None, node: Entity,
                           builder: ResultBuilder) -> list[XidEvent]:
    """NVML's events plus the XIDs logged since the last run, each XID once (NVML's
    alone without a kernel log)."""
    if log is None:
        return events
    try:
        logged = await anyio.to_thread.run_sync(log.take, "xid")
    except LogUnavailable as exc:
        builder.seen(node, kernel_log=str(exc))
        return events
    xids = [line for line in logged if isinstance(line, LoggedXid)]
    return log.merge_xids(events, xids, snapshot.gpus)


def findings_for_xids(
    events: Iterable[XidEvent], gpus: Iterable[GpuSnapshot], builder: ResultBuilder
) -> list[Finding]:
    """One finding per GPU and XID code, with how many events carried it.

    Events are matched to the snapshot's GPUs by UUID, then by index, so a finding
    lands on the same entity the NVML checks use; an event for a GPU the snapshot
    does not know still gets a GPU entity of its own."""
    known = list(gpus)
    by_uuid = {gpu.uuid: gpu for gpu in known if gpu.uuid}
    by_index = {gpu.index: gpu for gpu in known}
    by_pci = {gpu.pci_bus_id: gpu for gpu in known if gpu.pci_bus_id}
    counts = Counter(_event_key(event, by_uuid, by_index, by_pci) for event in events)
    return [
        _xid_finding(entity, xid, count, builder) for (entity, xid), count in counts.items()
    ]


def _event_key(
    event: XidEvent, by_uuid: dict[str, GpuSnapshot], by_index: dict[int, GpuSnapshot],
    by_pci: dict[str, GpuSnapshot],
) -> tuple[Entity, int]:
    gpu = by_uuid.get(event.uuid) or by_pci.get(event.pci_bus_id) or by_index.get(event.gpu_index)
    entity = gpu_entity(gpu) if gpu is not None else Entity.gpu(
        event.gpu_index, event.uuid, event.pci_bus_id)
    return entity, event.xid


def _xid_finding(entity: Entity, xid: int, count: int, builder: ResultBuilder) -> Finding:
    code = f"XID_{xid}"
    meaning = builder.catalog.lookup(code).description
    times = f" ({count} events)" if count > 1 else ""
    return builder.finding(code, entity, f"XID {xid}: {meaning}{times}", xid=xid, count=count)


def _all_unknown(gpus: Iterable[GpuSnapshot], builder: ResultBuilder, reason: str) -> None:
    for gpu in gpus:
        builder.unknown(gpu_entity(gpu), reason)
