"""What `healthd gpu-reset` says of each GPU, as JSON in the GPU-reset Job's termination
message, and its reader, for the controller (healthd.controller.reset_job):

    {"ok": false, "outcome": "refused",
     "gpus": [{"uuid": "GPU-...", "outcome": "refused", "exit_code": 255,
               "output": "The following GPUs could not be reset: ...",
               "holders": ["pid 4242 (dcgm-exporter): /dev/nvidia3 open"],
               "persistence_restored": true}]}

A GPU's `outcome`: `reset` (nvidia-smi reset it and it answers NVML with its UUID),
`refused` (something held it: nvidia-smi said "In use by another client"), or
`failed` (anything else: a GPU lost, unknown, a reset nvidia-smi cannot do here).
`holders` names what the command found holding the GPU before the reset
(healthd.repair.holders), persistence mode as "persistence mode (turned off for the
reset)" when the command let go of it; `persistence_restored` says whether it is on
again (null: it was not turned off). The top-level `outcome` is `failed` if any GPU
failed, else `refused` if any was refused, else `reset`; `ok` is true only for
`reset`.

The kubelet keeps 4096 bytes of a termination message: `encode` shortens outputs and
holder lists until the line fits, and, past that, leaves GPUs out, those reset first,
then those refused (`left_out` counts them). `reset_report` also reads the shape
before outcomes (`"ok"` per GPU and overall).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from healthd.repair.holders import named

Outcome = Literal["reset", "refused", "failed"]
_OUTCOMES: tuple[Outcome, ...] = ("reset", "refused", "failed")
_RANK: dict[Outcome, int] = {"failed": 0, "refused": 1, "reset": 2}  # who keeps a place first
MESSAGE_LIMIT = 4096  # bytes the kubelet keeps of a termination message
OUTPUT_CHARS = 300  # of nvidia-smi's output per GPU, before any shortening
# (output characters, holders named) per GPU, tried in turn until the message fits
_SHORTER = ((OUTPUT_CHARS, 16), (160, 8), (80, 4), (40, 2), (0, 1), (0, 0))
_REFUSALS = ("in use by another client", "in use by another process")


@dataclass(frozen=True)
class GpuResult:
    uuid: str
    outcome: Outcome
    exit_code: int | None  # nvidia-smi's; None: it did not finish or did not run
    output: str
    holders: tuple[str, ...] = ()
    persistence_restored: bool | None = None  # None: persistence mode was not on

    def summary(self) -> str:
        """The GPU and what became of it: what held it when refused, else what
        nvidia-smi said."""
        if self.outcome == "refused" and self.holders:
            return f"{self.uuid}: refused, held by {', '.join(self.holders)}"
        return f"{self.uuid}: {self.output}"


def overall(gpus: Sequence[GpuResult]) -> Outcome:
    """failed if any GPU failed, else refused if any was refused, else reset."""
    found = {g.outcome for g in gpus}
    return "failed" if "failed" in found else "refused" if "refused" in found else "reset"


@dataclass(frozen=True)
class ResetReport:
    gpus: tuple[GpuResult, ...]
    outcome: Outcome
    left_out: int = 0  # GPUs the message had no room for

    @classmethod
    def of(cls, gpus: Sequence[GpuResult]) -> ResetReport:
        return cls(tuple(gpus), overall(gpus))

    @property
    def ok(self) -> bool:
        return self.outcome == "reset"

    @property
    def refused(self) -> bool:
        """Nothing failed, but something held a GPU: the attempt reset nothing it was
        for (not spent from the repair budget)."""
        return self.outcome == "refused"

    def not_reset(self) -> list[GpuResult]:
        return [g for g in self.gpus if g.outcome != "reset"]

    def summary(self, chars: int) -> str:
        """Each GPU not reset and why (what held it, what nvidia-smi said), each
        clipped to `chars`."""
        return "; ".join(g.summary()[:chars] for g in self.not_reset())


def refused(exit_code: int | None, output: str) -> bool:
    """Whether nvidia-smi refused because something holds the GPU."""
    return exit_code not in (0, None) and any(r in output.lower() for r in _REFUSALS)


def outcome_of(exit_code: int | None, output: str, answers: str) -> Outcome:
    """A GPU's outcome from nvidia-smi's answer and whether the GPU answers NVML
    afterwards ("" when it does with its UUID)."""
    if exit_code == 0:
        return "failed" if answers else "reset"
    return "refused" if refused(exit_code, output) else "failed"


def encode(report: ResetReport, limit: int = MESSAGE_LIMIT) -> str:
    """The report as one line of JSON, under `limit` bytes (see the module docstring)."""
    for chars, holders in _SHORTER:
        line = _line(report, len(report.gpus), chars, holders)
        if len(line.encode()) <= limit:
            return line
    # Each GPU as short as it gets, and still too many: those that failed first.
    ordered = replace(report, gpus=tuple(sorted(report.gpus, key=lambda g: _RANK[g.outcome])))
    kept = len(report.gpus)
    while kept > 0 and len(_line(ordered, kept, 0, 0).encode()) > limit:
        kept -= 1
    return _line(ordered, kept, 0, 0)


def _line(report: ResetReport, kept: int, chars: int, holders: int) -> str:
    """The report's first `kept` GPUs, each output cut to its first `chars` characters
    and its holders to `holders`."""
    gpus = [{**asdict(g), "output": g.output[:chars],
             "holders": named(g.holders, holders) if holders else []}
            for g in report.gpus[:kept]]
    body: dict[str, Any] = {"ok": report.ok, "outcome": report.outcome, "gpus": gpus}
    if kept < len(report.gpus) or report.left_out:
        body["left_out"] = report.left_out + len(report.gpus) - kept
    return json.dumps(body, separators=(",", ":"))


def reset_report(message: str) -> ResetReport | None:
    """The report a GPU-reset pod's termination message holds; None when it holds
    none (not JSON, not the shape)."""
    try:
        doc = json.loads(message)
    except ValueError:
        return None
    gpus = doc.get("gpus") if isinstance(doc, dict) else None
    if not isinstance(gpus, list):
        return None
    results = [r for r in map(_gpu, gpus) if r is not None]
    left = doc.get("left_out")
    return ResetReport(tuple(results), _outcome(doc), left if isinstance(left, int) else 0)


def _outcome(doc: dict[str, Any]) -> Outcome:
    """The outcome `doc` (the report or one GPU's entry) says, or, in the shape before
    outcomes, what its `ok` says."""
    said = doc.get("outcome")
    for known in _OUTCOMES:
        if said == known:
            return known
    return "reset" if doc.get("ok") is True else "failed"


def _gpu(entry: object) -> GpuResult | None:
    if not isinstance(entry, dict) or not isinstance(entry.get("uuid"), str):
        return None
    outcome = _outcome(entry)
    code = entry.get("exit_code")
    holders = entry.get("holders")
    restored = entry.get("persistence_restored")
    return GpuResult(
        uuid=entry["uuid"], outcome=outcome,
        exit_code=code if isinstance(code, int) else None,
        output=str(entry.get("output", "")),
        holders=tuple(str(h) for h in holders) if isinstance(holders, list) else (),
        persistence_restored=restored if isinstance(restored, bool) else None)
