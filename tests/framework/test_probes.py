"""Checks get their stand-ins when they are built and each run gets a frozen context of
that round's data: a check that needs a new stand-in adds it to checks.probes and
reads it in its own module; nothing assigns a context's fields after it is built."""

from __future__ import annotations

import ast
import sys
from dataclasses import FrozenInstanceError
from pathlib import Path
from typing import ClassVar

import pytest

import checks
import checks.probes
from checks.base import BaseCheck, CheckContext, CheckResult, Entity, Peer, ResultBuilder, run_check
from checks.catalog import Catalog
from checks.probes import Probes
from healthd.check.plans import planned_check
from healthd.config import Config


class UptimeCheck(BaseCheck):
    """What a newcomer writes for a check with a stand-in: it reads its own field of
    the probes it was built with, and only round data from the context."""

    NAME: ClassVar[str] = "uptime"

    async def run(self, ctx: CheckContext) -> CheckResult:
        builder = ResultBuilder(self.NAME, ctx.catalog)
        assert self.probes.uptime is not None
        builder.seen(Entity.node(ctx.node_name), uptime_s=self.probes.uptime())
        return builder.build()


def test_the_round_context_cannot_be_changed_once_built() -> None:
    ctx = CheckContext(catalog=Catalog(), node_name="n1")
    with pytest.raises(FrozenInstanceError):
        ctx.peers = [Peer("n2", ["10.0.0.2"])]  # type: ignore[misc]
    with pytest.raises(FrozenInstanceError):
        ctx.node_name = "n3"  # type: ignore[misc]


@pytest.mark.anyio
async def test_a_check_built_with_a_stand_in_runs_on_a_plain_round_context() -> None:
    check = UptimeCheck(probes=Probes(uptime=lambda: 42.0))
    result = await run_check(check, CheckContext(catalog=Catalog(), node_name="n1"))
    assert [(e.entity.label, dict(e.values)) for e in result.entities] == [
        ("node", {"uptime_s": 42.0})]


@pytest.mark.parametrize("name", sorted(checks.REGISTRY))
def test_every_check_is_built_with_the_probes_it_is_given(name: str) -> None:
    probes = Probes(uptime=lambda: 1.0)
    assert checks.REGISTRY[name](probes=probes).probes is probes
    arg = "1" if checks.REGISTRY[name].ARG else None
    assert Config().build_check(name, arg, probes=probes).probes is probes  # type: ignore[attr-defined]
    key = f"{name}:{arg}" if arg else name
    assert planned_check(Config(), key, probes=probes).check.probes is probes  # type: ignore[attr-defined]


def test_the_probes_module_runs_on_the_standard_library_alone() -> None:
    # Its only other import is the snapshot's types, for annotations (TYPE_CHECKING).
    tree = ast.parse(Path(checks.probes.__file__).read_text())
    runtime: list[str] = []
    for node in tree.body:  # module level: what importing it runs
        if isinstance(node, ast.Import):
            runtime += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            runtime.append(node.module)
    assert runtime and all(m.split(".")[0] in sys.stdlib_module_names or m == "__future__"
                           for m in runtime), runtime
