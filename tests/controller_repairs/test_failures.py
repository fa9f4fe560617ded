"""A reset that fails, and a validation nobody answers: the attempt fails, says why,
and the next decision escalates by the history. No agent runs here: the node shows
what an agent left on it (REMAP_PENDING held on GPU 3)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest

from healthd.sim.apiserver import ApiEmulator
from healthd.sim.kubelet import FakeKubelet, Mode
from tests.agent.harness import KEYS, NODE, eventually
from tests.controller.conftest import KubeFactory, controllers
from tests.controller_repairs.conftest import agent_lets_go, controller_config, holding_node

pytestmark = pytest.mark.anyio


def attempts(api: ApiEmulator) -> list[tuple[str, str]]:
    text = (api.get("Node", NODE)["metadata"].get("annotations") or {}).get(KEYS.repair)
    return [(a["outcome"], a["remedy"]) for a in json.loads(text)["attempts"]] if text else []


def failures(api: ApiEmulator) -> list[str]:
    return [e["message"] for e in api.list("Event") if e.get("reason") == "RepairFailed"]


@asynccontextmanager
async def running(api: ApiEmulator, kube_for: KubeFactory, mode: Mode,
                  **repair: object) -> AsyncIterator[FakeKubelet]:
    api.seed(holding_node("REMAP_PENDING", "remapped", 3, "ERR"))
    kubelet = FakeKubelet(api, mode=mode)
    async with anyio.create_task_group() as group:
        group.start_soon(kubelet.run)
        group.start_soon(agent_lets_go, api)
        async with controllers(kube_for, controller_config(**repair), "ctl"):
            yield kubelet
        group.cancel_scope.cancel()


async def test_a_failed_reset_job_fails_the_attempt_and_two_lead_to_a_reboot(
        api: ApiEmulator, kube_for: KubeFactory) -> None:
    async with running(api, kube_for, Mode.FAIL) as kubelet:
        await eventually(lambda: attempts(api) == [("failed", "reset")] * 2, 20, "two failed")
        await eventually(lambda: len(failures(api)) == 2, 5, "the Events")
        assert all("GPU-reset Job" in m for m in failures(api))
        await eventually(lambda: json.loads(api.get("Node", NODE)["metadata"]["annotations"][
            KEYS.repair])["reason"].startswith("reboot needed"), 5, "a reboot needed")
        assert len(kubelet.jobs_seen) == 2


async def test_a_validation_nobody_answers_fails_after_the_timeout(
        api: ApiEmulator, kube_for: KubeFactory) -> None:
    async with running(api, kube_for, Mode.RUN, validation_timeout="1s"):
        await eventually(lambda: attempts(api)[:1] == [("failed", "reset")], 20, "failed")
        await eventually(lambda: failures(api), 5, "the Event")
        assert "did not answer the validation" in failures(api)[0]
