"""Fixtures for the dcgm check: a context with the default catalog, and checks that
run the fake dcgmi (the real subprocess path) on a recorded output."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pytest

from checks.base import CheckContext, CheckResult, Finding, Severity
from checks.catalog import Catalog
from checks.dcgm import DcgmCheck
from healthd.sim.dcgm import FAKE_DCGMI

NODE = "gpu-node-1"


@pytest.fixture
def ctx() -> CheckContext:
    return CheckContext(catalog=Catalog(), node_name=NODE)


FakeCheck = Callable[..., DcgmCheck]


@pytest.fixture
def fake_check() -> FakeCheck:
    """`fake_check("v4-fail-r3", "--noise", level=3)`: a DcgmCheck whose dcgmi is the
    fake, replaying that recording with those extra fake options."""

    def make(output: str, *fake_args: str, level: int = 3, **params: Any) -> DcgmCheck:
        command = [sys.executable, str(FAKE_DCGMI), "--output", output, *fake_args]
        return DcgmCheck({"level": level, "command": command, **params})

    return make


def by_code(result: CheckResult) -> dict[tuple[str, str], Finding]:
    """Findings keyed by (code, entity label), e.g. ("DCGM_MEMORY", "gpu2")."""
    return {(f.code, f.entity.label): f for f in result.findings}


def statuses(result: CheckResult) -> dict[str, Severity]:
    """Entity label -> status."""
    return {e.entity.label: e.status for e in result.entities}
