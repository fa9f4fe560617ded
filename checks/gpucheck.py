"""The shared skeleton of every check that judges one NVML snapshot.

NVML checks never call NVML: the access layer (checks.snapshot) reads the node once per
round and every check judges the same `NodeSnapshot`. What is common to all of them
lives here, written once:

- no GPU source, or a driver error -> the whole check is UNKNOWN with the snapshot's
  one-line reason ("NVIDIA driver not found");
- every GPU becomes an `Entity` with its index, UUID, PCI bus id and model;
- a lost GPU is UNKNOWN for every check ("GPU is lost"), except the `gpus` check,
  which owns GPU_MISSING (it overrides `lost`);
- a MIG-enabled GPU carries the value `mig=True`: reported, never a failure;
- `unwrap` turns one NVML reading into a value, or into SKIPPED (Unsupported) or
  UNKNOWN (Failed) for that GPU.

A subclass (`class EccCheck(GpuCheck[NoParams])`) sets the usual ClassVars and
implements `judge` (one GPU); it may add node-wide conclusions in `conclude`, or
extend `examine` (the xid check collects events there).
"""

from __future__ import annotations

from typing import ClassVar, Generic, TypeVar, cast

from pydantic import BaseModel

from checks.base import BaseCheck, CheckContext, CheckResult, Entity, ResultBuilder
from checks.snapshot import (
    DRIVER_NOT_FOUND,
    Failed,
    GpuSnapshot,
    NodeSnapshot,
    Ok,
    Reading,
    Unsupported,
)

T = TypeVar("T")
P = TypeVar("P", bound=BaseModel)

GPU_LOST = "GPU is lost"


def gpu_entity(gpu: GpuSnapshot) -> Entity:
    """The entity every NVML check reports a GPU as (same key in every check)."""
    return Entity.gpu(gpu.index, gpu.uuid, gpu.pci_bus_id, gpu.model)


def unwrap(
    reading: Reading[T],
    what: str,
    entity: Entity,
    builder: ResultBuilder,
    *,
    optional: bool = False,
) -> T | None:
    """The value of an NVML reading, or None after recording why there is none.

    Ok -> its value. Unsupported -> the GPU is SKIPPED for this check with the reason
    (or, with `optional=True`, nothing is recorded: the property is simply not
    judged on this GPU). Failed, Ok(None), or anything that is not a reading at
    all -> the GPU is UNKNOWN with the reason. `what` names the property in the reason."""
    if isinstance(reading, Ok):
        if reading.value is None:  # a None would read as "already recorded" to callers
            builder.unknown(entity, f"{what}: NVML returned no value")
        return reading.value
    if isinstance(reading, Unsupported):
        if not optional:
            builder.skip(entity, f"{what}: {reading.reason}")
        return None
    if isinstance(reading, Failed):
        builder.unknown(entity, f"{what}: {reading.reason}")
        return None
    builder.unknown(entity, f"{what}: unreadable NVML reading {type(reading).__name__}")
    return None


class GpuCheck(BaseCheck, Generic[P]):
    """Base of the NVML checks: gets the round's snapshot and walks the GPUs.

    Parametrised by the check's Params model, so `settings` is typed while `params`
    keeps the Check protocol's type: `class PcieCheck(GpuCheck[PcieParams])`."""

    INPUTS: ClassVar[frozenset[str] | None] = frozenset({"nvml"})

    @property
    def settings(self) -> P:
        """`params`, typed as this check's Params model (validated by BaseCheck)."""
        return cast(P, self.params)

    async def run(self, ctx: CheckContext) -> CheckResult:
        if ctx.gpus is None:
            return CheckResult.unknown(self.NAME, DRIVER_NOT_FOUND)
        try:
            snapshot = await ctx.gpus.snapshot()
        except Exception as exc:  # the access layer should not raise; never crash if it does
            return CheckResult.unknown(self.NAME, f"cannot read NVML: {type(exc).__name__}: {exc}")
        if snapshot.driver_error:
            return CheckResult.unknown(self.NAME, snapshot.driver_error)
        builder = ResultBuilder(self.NAME, ctx.catalog)
        await self.examine(snapshot, ctx, builder)
        return builder.build()

    async def examine(
        self, snapshot: NodeSnapshot, ctx: CheckContext, builder: ResultBuilder
    ) -> None:
        """Judge every GPU, then the node as a whole. Event-driven checks extend this."""
        for gpu in snapshot.gpus:
            self.visit(gpu, builder)
        self.conclude(snapshot, ctx, builder)

    def visit(self, gpu: GpuSnapshot, builder: ResultBuilder) -> None:
        """One GPU: lost, MIG and judged; a bug in `judge` costs only this GPU."""
        entity = gpu_entity(gpu)
        if gpu.lost:
            self.lost(gpu, entity, builder)
            return
        builder.seen(entity)
        if gpu.mig_enabled:
            builder.seen(entity, mig=True)
        try:
            self.judge(gpu, entity, builder)
        except Exception as exc:  # garbage in one GPU's snapshot must not hide the others
            builder.unknown(entity, f"cannot judge: {type(exc).__name__}: {exc}")

    def lost(self, gpu: GpuSnapshot, entity: Entity, builder: ResultBuilder) -> None:
        """A lost GPU cannot be judged by this check; the `gpus` check reports it."""
        reason = f"{GPU_LOST}: {gpu.lost_reason}" if gpu.lost_reason else GPU_LOST
        builder.unknown(entity, reason)

    def judge(self, gpu: GpuSnapshot, entity: Entity, builder: ResultBuilder) -> None:
        """Judge one reachable GPU: record values, findings, skips. Subclasses implement."""
        raise NotImplementedError

    def conclude(self, snapshot: NodeSnapshot, ctx: CheckContext, builder: ResultBuilder) -> None:
        """Node-wide conclusions after every GPU was judged (none by default)."""
