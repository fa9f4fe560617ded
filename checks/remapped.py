"""The `remapped` check: HBM row remapping state, per GPU.

Ampere and later GPUs repair bad memory rows by remapping them. A remap waits for
the next GPU reset (REMAP_PENDING: unfit for new work until reset); a remap that
could not be done means the GPU has run out of spare rows (REMAP_FAILURE: sticky,
the GPU needs service). Autopilot looks only at "pending"; we judge both and report
the counts on every GPU so trends show before anything fails.
"""

from __future__ import annotations

from typing import ClassVar

from checks.base import AutopilotGauge, Entity, Measure, NoParams, ResultBuilder, measures
from checks.gpucheck import GpuCheck, unwrap
from checks.snapshot import GpuSnapshot, RemappedRows


class RemappedCheck(GpuCheck[NoParams]):
    NAME: ClassVar[str] = "remapped"
    DESCRIPTION: ClassVar[str] = "GPU memory row remapping: pending remaps and remap failures"
    MEASURES: ClassVar[tuple[Measure, ...]] = (
        *measures("healthd_gpu_remapped_rows", "GPU memory rows remapped.", "kind",
                  {"correctable": "correctable", "uncorrectable": "uncorrectable"}),
        Measure("healthd_gpu_row_remap_pending", "1 when a row remap waits for a GPU reset.",
                "pending"),
        Measure("healthd_gpu_row_remap_failed", "1 when a row remap failed.", "failure"),
    )
    AUTOPILOT: ClassVar[AutopilotGauge | None] = AutopilotGauge("remapped")
    CODES: ClassVar[tuple[str, ...]] = ("REMAP_PENDING", "REMAP_FAILURE", "GPU_MISSING")
    DEFAULT_INTERVAL_S: ClassVar[float] = 30.0
    DEFAULT_TIMEOUT_S: ClassVar[float] = 10.0

    def judge(self, gpu: GpuSnapshot, entity: Entity, builder: ResultBuilder) -> None:
        rows = unwrap(gpu.remapped, "remapped rows", entity, builder)
        if rows is None:
            return
        builder.seen(
            entity,
            correctable=rows.correctable,
            uncorrectable=rows.uncorrectable,
            pending=rows.pending,
            failure=rows.failure,
        )
        if rows.failure:
            message = f"row remapping failed ({_counts(rows)}): the GPU needs service"
            builder.finding("REMAP_FAILURE", entity, message)
        if rows.pending:
            builder.finding(
                "REMAP_PENDING", entity, f"row remapping pending ({_counts(rows)}): reset the GPU"
            )


def _counts(rows: RemappedRows) -> str:
    return f"{rows.uncorrectable} uncorrectable, {rows.correctable} correctable rows remapped"
