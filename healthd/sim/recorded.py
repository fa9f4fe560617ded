"""Replay never invents results: the one rule for what a recording does not hold.

A recording (`healthd record`) lists the sources it holds in the spec's `recorded`
(`nvml`, `xid`, `pciebw`, `dcgm`, ...); a check lists what it reads in its `INPUTS`
(checks.base.inputs_of). On replay, a check that reads a source the recording does
not hold is not run: it is SKIPPED "not recorded: <sources>", never PASS. A spec
without `recorded` is not a recording, and everything in it is simulated.

A new recorded source needs two things: `healthd record` adds its name to
`recorded` when it captured it (healthd.record.recording.sources), and the checks that read it
name it in their INPUTS. Nothing here changes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pydantic import BaseModel

from checks.base import Check, CheckContext, CheckResult, inputs_of
from healthd.check.plans import Planned
from healthd.sim.machine import MachineSpec


def missing_inputs(spec: MachineSpec, check: Check) -> list[str]:
    """The sources `check` reads that the recording `spec` does not hold (none when
    `spec` is not a recording)."""
    if spec.recorded is None:
        return []
    return sorted(inputs_of(check) - set(spec.recorded))


@dataclass(frozen=True)
class NotRecorded:
    """Stands in for a check whose inputs a recording does not hold."""

    check: Check
    missing: tuple[str, ...]

    @property
    def NAME(self) -> str:  # the Check protocol's name
        return self.check.NAME

    @property
    def params(self) -> BaseModel:
        return self.check.params

    @property
    def exclusive(self) -> bool:
        return False  # it holds no GPU

    @property
    def timeout_s(self) -> float:
        return self.check.timeout_s

    @property
    def labelled_level(self) -> int | None:
        return None  # it runs no diagnostic

    async def run(self, ctx: CheckContext) -> CheckResult:
        return CheckResult.skipped(self.NAME, f"not recorded: {', '.join(self.missing)}")


def replayable(spec: MachineSpec, item: Planned) -> Planned:
    """`item` as the replay of `spec` runs it."""
    missing = missing_inputs(spec, item.check)
    return replace(item, check=NotRecorded(item.check, tuple(missing))) if missing else item
