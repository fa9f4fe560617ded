"""The `gpus` check: every expected GPU is there and reachable.

It owns GPU_MISSING (sticky EVICT): on the node when NVML enumerates fewer GPUs than
expected ("7 of 8 expected GPUs visible"), and on each GPU NVML reports as lost
(fallen off the bus). The expected count comes from the `expected` parameter, else
from the context (e.g. the node's `nvidia.com/gpu` capacity); with neither, counts
are not compared. Reachable GPUs PASS.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from checks.base import CheckContext, Entity, ResultBuilder
from checks.gpucheck import GpuCheck
from checks.snapshot import GpuSnapshot, NodeSnapshot


class GpusParams(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    expected: int | None = Field(
        None, ge=0, description="GPUs this node must have; unset: the context's count, if any"
    )


class GpusCheck(GpuCheck[GpusParams]):
    NAME: ClassVar[str] = "gpus"
    DESCRIPTION: ClassVar[str] = "every expected GPU is enumerated by NVML and reachable"
    CODES: ClassVar[tuple[str, ...]] = ("GPU_MISSING",)
    Params: ClassVar[type[BaseModel]] = GpusParams
    DEFAULT_INTERVAL_S: ClassVar[float] = 30.0
    DEFAULT_TIMEOUT_S: ClassVar[float] = 10.0


    def judge(self, gpu: GpuSnapshot, entity: Entity, builder: ResultBuilder) -> None:
        """A reachable GPU passes; being seen is all this check asks of it."""

    def lost(self, gpu: GpuSnapshot, entity: Entity, builder: ResultBuilder) -> None:
        detail = f": {gpu.lost_reason}" if gpu.lost_reason else ""
        builder.finding("GPU_MISSING", entity, f"GPU {gpu.index} is lost{detail}", lost=True)

    def conclude(self, snapshot: NodeSnapshot, ctx: CheckContext, builder: ResultBuilder) -> None:
        node = Entity.node(ctx.node_name or "node")
        visible = len(snapshot.gpus)
        lost = sum(1 for gpu in snapshot.gpus if gpu.lost)
        builder.seen(node, visible=visible, lost=lost)
        expected = self.settings.expected
        if expected is None:
            expected = ctx.expected_gpus
        if expected is None:
            return
        builder.seen(node, expected=expected)
        if visible < expected:
            builder.finding(
                "GPU_MISSING", node, f"{visible} of {expected} expected GPUs visible"
            )

