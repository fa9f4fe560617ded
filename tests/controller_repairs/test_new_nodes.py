"""Validation of a node seen for the first time (`controller.repair.validate_new_nodes`):
the node is TESTING until its validation set passes, then PASS; off, it goes PASS on
its agent's word alone."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from healthd.sim.apiserver import ApiEmulator
from tests.agent.harness import eventually
from tests.controller.conftest import KubeFactory
from tests.controller_repairs.conftest import Cluster, cluster, controller_config

pytestmark = pytest.mark.anyio


async def labels_until_settled(c: Cluster, settled: object) -> list[str | None]:
    """The node's label values, each change once, until `settled()` holds."""
    seen: list[str | None] = []
    with anyio.fail_after(60):
        while True:
            if not seen or seen[-1] != c.agent.verdict():
                seen.append(c.agent.verdict())
            if settled():  # type: ignore[operator]
                return seen
            await anyio.sleep(0.02)


async def test_a_new_node_is_testing_until_its_validation_passes(
        api: ApiEmulator, kube_for: KubeFactory, tmp_path: Path) -> None:
    config = controller_config(validate_new_nodes=True)
    async with cluster(api, kube_for, tmp_path, spec="healthy-8xh100", config=config) as c:
        await eventually(lambda: "awaiting the validation of a new node" in (
            c.agent.condition() or {}).get("message", "") or c.repair() is not None, 15,
            "TESTING, saying why")
        seen = await labels_until_settled(c, lambda: c.repair() is not None and c.state() == ""
                                          and c.agent.verdict() == "PASS")
        assert [v for v in seen if v] == ["TESTING", "PASS"]  # never PASS before it passed
        condition = c.agent.condition()
        assert condition is not None and condition["reason"] == "GPUsHealthy"
        last = c.agent.last_run()
        assert last is not None and last["id"] == "new-node" and last["accepted"]
        assert set(last["checks"].values()) <= {"PASS", "WARN", "SKIPPED"}
        doc = c.repair()
        assert doc is not None and doc["attempts"] == []  # no repair budget spent
        await eventually(lambda: c.events("RepairSucceeded"), 5, "the Event")
        assert len(c.events("NodeValidating")) == 1
        assert c.metric("healthd_controller_repairs_total", action="validate",
                        outcome="passed") == 1


async def test_without_the_option_a_new_node_goes_pass_directly(
        api: ApiEmulator, kube_for: KubeFactory, tmp_path: Path) -> None:
    async with cluster(api, kube_for, tmp_path, spec="healthy-8xh100") as c:
        seen = await labels_until_settled(c, lambda: c.agent.verdict() == "PASS")
        await anyio.sleep(1.0)
        assert [v for v in seen if v] == ["PASS"] and c.agent.verdict() == "PASS"
        assert c.repair() is None and c.events("NodeValidating") == []
        assert c.repair_writes() == []
