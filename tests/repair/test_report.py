"""The GPU-reset report as the controller reads it from the Job's termination message:
it fits in the 4096 bytes the kubelet keeps however many GPUs and holders there are,
tells refused from failed, and the reader understands both its shape and the one
before outcomes."""

from __future__ import annotations

import json

import pytest

from healthd.controller.reset_job import failed_gpus
from healthd.repair.report import (
    MESSAGE_LIMIT,
    GpuResult,
    ResetReport,
    encode,
    outcome_of,
    reset_report,
)

UUID = "GPU-9cf5b221-73ea-4e88-80f8-1f2e4929bb7{}"
IN_USE = ("The following GPUs could not be reset:\n  GPU 00000000:18:00.0: In use by "
          "another client\n\n1 device is currently being used by one or more other processes")


def test_a_refusal_is_told_from_a_failure() -> None:
    assert outcome_of(0, "GPU 00000000:18:00.0 was successfully reset.", "") == "reset"
    assert outcome_of(0, "was successfully reset", "nvmlDeviceGetUUID: GPU is lost") == "failed"
    assert outcome_of(255, IN_USE, "") == "refused"
    assert outcome_of(255, "GPU 00000000:C1:00.0 is currently in use by another process.",
                      "") == "refused"  # older drivers' words
    assert outcome_of(255, "GPU 00000000:18:00.0: MIG mode is enabled", "") == "failed"
    assert outcome_of(1, "GPU is lost", "") == "failed"
    assert outcome_of(None, "no answer within 120 s", "") == "failed"


def report(outcomes: list[str], holders: int = 0, output: str = "x" * 300) -> ResetReport:
    return ResetReport.of([
        GpuResult(UUID.format(n), outcome, 255, output,  # type: ignore[arg-type]
                  tuple(f"pid {4000 + h} (dcgm-exporter-{h}): /dev/nvidia{n} open"
                        for h in range(holders)), True)
        for n, outcome in enumerate(outcomes)])


@pytest.mark.parametrize("gpus", [1, 8, 64])
def test_the_message_fits_the_kubelets_limit_and_reads_back(gpus: int) -> None:
    full = report(["refused"] * (gpus - 1) + ["failed"], holders=40)
    line = encode(full)
    assert len(line.encode()) <= MESSAGE_LIMIT
    read = reset_report(line)
    assert read is not None
    assert (read.outcome, read.ok) == ("failed", False)
    assert len(read.gpus) + read.left_out == gpus
    assert "failed" in {g.outcome for g in read.gpus}  # what was not reset comes first
    if gpus == 1:
        assert read.gpus[0].holders[-1].endswith("more")  # holders named, the rest counted


def test_a_short_report_is_whole() -> None:
    full = report(["reset", "refused"], holders=2, output=IN_USE)
    assert reset_report(encode(full)) == full


def test_the_top_outcome_is_the_worst_gpus() -> None:
    assert report(["reset", "reset"]).outcome == "reset"
    assert report(["reset", "refused"]).outcome == "refused"
    assert report(["refused", "failed", "reset"]).outcome == "failed"


def test_what_was_not_reset_is_said_with_what_held_it() -> None:
    message = encode(ResetReport.of([
        GpuResult(UUID.format(0), "reset", 0, "was successfully reset"),
        GpuResult(UUID.format(1), "refused", 255, IN_USE, ("pid 7 (nv-hostengine): "
                                                           "/dev/nvidia1 open",)),
        GpuResult(UUID.format(2), "failed", 1, "GPU is lost")]))
    assert failed_gpus(message) == (f"{UUID.format(1)}: refused, held by pid 7 (nv-hostengine): "
                                    f"/dev/nvidia1 open; {UUID.format(2)}: GPU is lost")


def test_the_shape_before_outcomes_still_reads() -> None:
    message = json.dumps({"ok": False, "gpus": [
        {"uuid": "GPU-1", "ok": True, "exit_code": 0, "output": "reset"},
        {"uuid": "GPU-2", "ok": False, "exit_code": 1, "output": "GPU is lost"}]})
    read = reset_report(message)
    assert read is not None and read.outcome == "failed"
    assert [g.outcome for g in read.gpus] == ["reset", "failed"]
    assert failed_gpus(message) == "GPU-2: GPU is lost"
    assert reset_report("not json") is None and reset_report("[1]") is None
