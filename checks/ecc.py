"""The `ecc` check: uncorrected ECC errors and pending page retirements, per GPU.

Volatile uncorrected ECC errors (since the last driver load) mean data in GPU
memory was lost -> ECC_UNCORRECTED. Before Ampere, bad pages are retired instead of
rows remapped, and a retirement waits for a reset -> PAGES_PENDING. Hopper and later
do not support page retirement (NVML says NotSupported): that property is then not
judged, while the ECC counters still are. A GPU with ECC disabled or unsupported is
SKIPPED: there is nothing to judge.
"""

from __future__ import annotations

from typing import ClassVar

from checks.base import Entity, Measure, NoParams, ResultBuilder, measures
from checks.gpucheck import GpuCheck, unwrap
from checks.snapshot import GpuSnapshot


class EccCheck(GpuCheck[NoParams]):
    NAME: ClassVar[str] = "ecc"
    DESCRIPTION: ClassVar[str] = "uncorrected ECC errors and retired pages pending a reset"
    MEASURES: ClassVar[tuple[Measure, ...]] = measures(
        "healthd_gpu_ecc_volatile_errors", "ECC errors since the driver loaded.", "kind",
        {"corrected": "ecc_corrected", "uncorrected": "ecc_uncorrected"})
    CODES: ClassVar[tuple[str, ...]] = ("ECC_UNCORRECTED", "PAGES_PENDING", "GPU_MISSING")
    DEFAULT_INTERVAL_S: ClassVar[float] = 30.0
    DEFAULT_TIMEOUT_S: ClassVar[float] = 10.0

    def judge(self, gpu: GpuSnapshot, entity: Entity, builder: ResultBuilder) -> None:
        ecc = unwrap(gpu.ecc, "ECC", entity, builder)
        if ecc is None:
            return
        builder.seen(
            entity,
            ecc_corrected=ecc.corrected_volatile,
            ecc_uncorrected=ecc.uncorrected_volatile,
        )
        if ecc.uncorrected_volatile > 0:
            builder.finding(
                "ECC_UNCORRECTED",
                entity,
                f"{ecc.uncorrected_volatile} uncorrected ECC errors since the driver loaded "
                f"({ecc.corrected_volatile} corrected)",
            )
        pending = unwrap(
            gpu.retired_pages_pending, "retired pages", entity, builder, optional=True
        )
        if pending is None:
            return
        builder.seen(entity, pages_pending=pending)
        if pending:
            builder.finding("PAGES_PENDING", entity, "retired pages pending: reset the GPU")
