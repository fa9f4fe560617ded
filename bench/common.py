"""What every benchmark shares: the command line, the machine description, the
statistics and the one JSON object a benchmark prints.

A benchmark is a script, `python bench/<name>.py [--quick]`, that measures the real
agent or controller code on the simulation and prints exactly one JSON object on
stdout::

    {"benchmark": "fault_to_label", "date": "...", "quick": false,
     "machine": {"nproc": 2, "cpu_model": "...", "ram_gib": 23.4, ...},
     "figures": {...}, "goals": {"xid_p99_s": {"value": 0.12, "goal": 2.0,
                                               "op": "<=", "met": true}}}

Logs go to stderr. A goal that is missed is a figure, never an exit status: a
benchmark exits non-zero only when it could not measure at all (and then still
prints one JSON object, with `error`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import platform
import statistics
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Goal:
    """A target a figure is held against: `value <= goal` (op "<=") or `>=`."""

    value: float | None
    goal: float
    op: str = "<="

    def as_json(self) -> dict[str, Any]:
        met = None
        if self.value is not None:
            met = self.value <= self.goal if self.op == "<=" else self.value >= self.goal
        return {"value": _round(self.value), "goal": self.goal, "op": self.op, "met": met}


def parser(description: str) -> argparse.ArgumentParser:
    """The shared command line: `--quick` for a short run (what the tests use)."""
    out = argparse.ArgumentParser(description=description)
    out.add_argument("--quick", action="store_true",
                     help="a short run that proves the benchmark works (figures are rough)")
    return out


def machine() -> dict[str, Any]:
    """The machine the figures were taken on."""
    return {
        "nproc": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "ram_gib": _ram_gib(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _ram_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def summary(samples: Sequence[float]) -> dict[str, Any]:
    """n, min, p50, p90, p99, max and mean of `samples` (seconds or any unit)."""
    if not samples:
        return {"n": 0, "min": None, "p50": None, "p90": None, "p99": None, "max": None,
                "mean": None}
    ordered = sorted(samples)
    return {"n": len(ordered), "min": _round(ordered[0]), "p50": _round(percentile(ordered, 50)),
            "p90": _round(percentile(ordered, 90)), "p99": _round(percentile(ordered, 99)),
            "max": _round(ordered[-1]), "mean": _round(statistics.fmean(ordered))}


def percentile(ordered: Sequence[float], pct: float) -> float:
    """The `pct` percentile of sorted samples, by linear interpolation."""
    if len(ordered) == 1:
        return ordered[0]
    rank = (len(ordered) - 1) * pct / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _round(value: Any) -> Any:
    return round(value, 6) if isinstance(value, float) else value


def emit(name: str, *, quick: bool, figures: Mapping[str, Any],
         goals: Mapping[str, Goal], notes: Sequence[str] = (),
         error: str | None = None) -> None:
    """Print the benchmark's one JSON object on stdout."""
    out: dict[str, Any] = {
        "benchmark": name,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "quick": quick,
        "machine": machine(),
        "figures": dict(figures),
        "goals": {key: goal.as_json() for key, goal in goals.items()},
        "notes": list(notes),
    }
    if error is not None:
        out["error"] = error
    print(json.dumps(out, indent=2, default=str), flush=True)


def main(name: str, measure: Callable[[argparse.Namespace], tuple[dict[str, Any],
                                                                  dict[str, Goal], list[str]]],
         args: argparse.Namespace) -> int:
    """Run `measure(args) -> (figures, goals, notes)` and print the result; an error
    still prints one JSON object (with `error`) and exits 1."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    try:
        figures, goals, notes = measure(args)
    except Exception as exc:  # report, do not crash with a bare traceback on stdout
        traceback.print_exc(file=sys.stderr)
        emit(name, quick=args.quick, figures={}, goals={}, error=f"{type(exc).__name__}: {exc}")
        return 1
    emit(name, quick=args.quick, figures=figures, goals=goals, notes=notes)
    return 0
