"""An exclusive diagnostic outlives the agent that started it: it belongs to the node.

`healthd.io/run=dcgm:3` holds the node TESTING while its Job runs (really: the fake
kubelet runs the Job's own `healthd check --checks dcgm:3` on the simulated machine,
held running until the test lets it end). Then the agent goes away:

- stopped as SIGTERM stops it (a rollout): it leaves the Job running, writes no PASS
  and announces no end; the next agent answers the request once, with its id, from
  the real result, writes `dcgm.level.3`, and deletes the Job;
- killed (SIGKILL, an OOM kill: a real process): the next agent keeps the node
  TESTING while the Job runs, reads the result once (a failing one ends EVICT, never
  PASS), answers once, deletes the Job;
- the Job's pod deleted meanwhile (a drain): the diagnostic is UNKNOWN, the request is
  answered with that, the node leaves TESTING;
- the Job itself gone, or one that cannot be read: the node leaves TESTING, nothing
  is reported as passed.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from healthd.sim.apiserver import ApiEmulator
from healthd.sim.kubelet import FakeKubelet, HealthdRunner, Termination
from healthd.sim.machine import MachineSpec
from healthd.util.times import rfc3339
from tests.agent.harness import (
    KEYS,
    NODE,
    Harness,
    eventually,
    fast_config,
    node_object,
    running_agent,
)
from tests.agent.test_deep import DIAG_NS, spec_with_dcgm, verdicts_written
from tests.agent.test_process import HEALTHD, clean_env

pytestmark = pytest.mark.anyio

CONFIG = fast_config(deep_diagnostics={"namespace": DIAG_NS, "image": "healthd:test"})


class HeldRunner:
    """The diagnostic's container: Running until the test lets it end, then the Job's
    own command on the simulated machine."""

    def __init__(self, spec_file: Path) -> None:
        self.release = anyio.Event()
        self.runs = 0  # containers started
        self._inner = HealthdRunner(spec_file)

    async def __call__(self, pod: dict[str, Any]) -> Termination:
        self.runs += 1
        await self.release.wait()
        return await self._inner(pod)


@asynccontextmanager
async def held_kubelet(api: ApiEmulator, spec: MachineSpec,
                       tmp_path: Path) -> AsyncIterator[HeldRunner]:
    spec_file = tmp_path / "machine.yaml"
    spec_file.write_text(spec.model_dump_json())
    held = HeldRunner(spec_file)
    async with anyio.create_task_group() as group:
        group.start_soon(FakeKubelet(api, runner=held).run)
        yield held
        group.cancel_scope.cancel()


def diagnostic_running(api: ApiEmulator) -> bool:
    return any(p["status"].get("phase") == "Running" for p in api.list("Pod", DIAG_NS))


def node_labels(api: ApiEmulator) -> dict[str, str]:
    return dict(api.get("Node", NODE)["metadata"].get("labels") or {})


def answer_to(h: Harness, run_id: str) -> dict[str, Any] | None:
    answer = h.last_run()
    return answer if answer is not None and answer["id"] == run_id else None


def answers_written(api: ApiEmulator, run_id: str) -> int:
    """How many writes to the Node carried an answer to request `run_id`."""
    count = 0
    for write in api.writes(None, rf"/api/v1/nodes/{NODE}"):
        body = write.body if isinstance(write.body, dict) else {}
        text = ((body.get("metadata") or {}).get("annotations") or {}).get(KEYS.last_run)
        count += bool(text) and json.loads(text)["id"] == run_id
    return count


def answer_events(api: ApiEmulator, run_id: str) -> list[dict[str, Any]]:
    return [e for e in api.list("Event") if e.get("reason") == "HealthRequestDone"
            and f"({run_id})" in e["message"]]


SPEC = spec_with_dcgm("v4-pass-r3")


@asynccontextmanager
async def stopped_during_the_diagnostic(api: ApiEmulator, tmp_path: Path,
                                        run_id: str) -> AsyncIterator[HeldRunner]:
    """An agent asked for dcgm:3, stopped (as SIGTERM stops it) while the Job runs;
    the Job's container stays held until the test lets it end."""
    async with held_kubelet(api, SPEC, tmp_path) as held:
        async with running_agent(api, tmp_path, spec=SPEC, config=CONFIG) as h:
            await h.judged()
            h.request("dcgm:3", run_id=run_id)
            await eventually(lambda: diagnostic_running(api), 30, "the diagnostic running")
            await eventually(lambda: h.verdict() == "TESTING", 10, "TESTING")
        yield held


@asynccontextmanager
async def next_agent(api: ApiEmulator, tmp_path: Path) -> AsyncIterator[Harness]:
    async with running_agent(api, tmp_path, spec=SPEC, config=CONFIG, seed=False) as h:
        yield h


async def test_a_stopping_agent_leaves_its_diagnostic_to_the_next(
        api: ApiEmulator, tmp_path: Path) -> None:
    async with stopped_during_the_diagnostic(api, tmp_path, "rollout-1") as held:
        stopped_at = rfc3339(time.time())
        assert len(api.list("Job", DIAG_NS)) == 1, "the stopping agent deleted the Job"
        assert node_labels(api)[KEYS.gpuhealth] == "TESTING"
        assert answers_written(api, "rollout-1") == 0
        assert not [e for e in api.list("Event") if "ended" in e["message"]]

        async with next_agent(api, tmp_path) as h:
            await h.judged()
            assert h.verdict() == "TESTING"  # the Job still runs
            held.release.set()
            answer = await eventually(lambda: answer_to(h, "rollout-1"), 60, "the answer")
            assert (answer["accepted"], answer["checks"]) == (True, {"dcgm:3": "PASS"}), answer
            assert answer["start"] <= stopped_at  # answered from when the request was taken
            assert h.labels()[KEYS.dcgm_level(3)].startswith("PASS_")
            assert h.verdict() == "PASS"
            await eventually(lambda: api.list("Job", DIAG_NS) == [], 10, "the Job deleted")
            await eventually(lambda: answer_events(api, "rollout-1"), 10, "the answer's Event")
    assert held.runs == 1  # one Job, one run: nothing was started again
    assert answers_written(api, "rollout-1") == 1
    assert len(answer_events(api, "rollout-1")) == 1


@pytest.mark.parametrize(("output", "status", "verdict", "level"), [
    ("v4-pass-r3", "PASS", "PASS", "PASS_"),
    ("v4-fail-r3", "EVICT", "EVICT", "ERR_"),  # DCGM_MEMORY on GPU 2: fatal
], ids=["passing", "failing"])
async def test_a_killed_agent_s_diagnostic_is_finished_by_the_next(
        api: ApiEmulator, tmp_path: Path, output: str, status: str, verdict: str,
        level: str) -> None:
    spec = spec_with_dcgm(output)
    spec_file = tmp_path / "agent-machine.yaml"
    spec_file.write_text(spec.model_dump_json())
    config_file = tmp_path / "healthd.yaml"
    config_file.write_text(CONFIG.model_dump_json(exclude_unset=True))
    api.seed(node_object())
    argv = [*HEALTHD, "agent", "--sim", str(spec_file), "--node", NODE, "--http-port", "0",
            "--kubeconfig", str(api.write_kubeconfig(tmp_path / "kubeconfig")),
            "--config", str(config_file)]
    async with held_kubelet(api, spec, tmp_path) as held:
        async with await anyio.open_process(argv, env=clean_env(tmp_path)) as proc:
            try:
                await eventually(lambda: node_labels(api).get(KEYS.gpuhealth) == "PASS", 30,
                                 "the first verdict")
                node = api.get("Node", NODE)
                node["metadata"].setdefault("annotations", {}).update(
                    {KEYS.run: "dcgm:3", KEYS.run_id: "oom-1"})
                api.put(node)
                await eventually(lambda: diagnostic_running(api), 30, "the diagnostic running")
                await eventually(lambda: node_labels(api)[KEYS.gpuhealth] == "TESTING", 10,
                                 "TESTING")
            finally:
                proc.kill()
            await proc.wait()
        assert len(api.list("Job", DIAG_NS)) == 1
        api.clear_log()

        async with running_agent(api, tmp_path, spec=spec, config=CONFIG, seed=False) as h:
            await h.judged()
            assert h.verdict() == "TESTING", "the new agent judged while the diagnostic runs"
            assert verdicts_written(h) == []
            held.release.set()
            answer = await eventually(lambda: answer_to(h, "oom-1"), 60, "the answer")
            assert answer["checks"] == {"dcgm:3": status}, answer
            assert h.labels()[KEYS.dcgm_level(3)].startswith(level)
            await eventually(lambda: api.list("Job", DIAG_NS) == [], 10, "the Job deleted")
            assert h.verdict() == verdict
            assert verdicts_written(h) == [verdict]  # straight from TESTING to the result
            await eventually(lambda: answer_events(api, "oom-1"), 10, "the answer's Event")
    assert held.runs == 1
    assert answers_written(api, "oom-1") == 1
    assert len(answer_events(api, "oom-1")) == 1


async def test_a_diagnostic_whose_pod_is_gone_is_unknown_and_answered(
        api: ApiEmulator, tmp_path: Path) -> None:
    async with stopped_during_the_diagnostic(api, tmp_path, "drained-1"):
        (pod,) = api.list("Pod", DIAG_NS)
        api.remove("Pod", pod["metadata"]["name"], DIAG_NS)  # a drain, while no agent runs
        await eventually(lambda: (api.list("Job", DIAG_NS)[0].get("status") or {}).get("failed"),
                         10, "the Job failed")

        async with next_agent(api, tmp_path) as h:
            answer = await eventually(lambda: answer_to(h, "drained-1"), 30, "the answer")
            assert answer["checks"] == {"dcgm:3": "UNKNOWN"}, answer
            assert "gone without a result" in answer["reasons"]["dcgm:3"]
            await eventually(lambda: h.verdict() == "PASS", 10, "out of TESTING")
            assert "PASS" in verdicts_written(h) and KEYS.dcgm_level(3) not in h.labels()
            await eventually(lambda: api.list("Job", DIAG_NS) == [], 10, "the Job deleted")
            failed = await eventually(lambda: h.events("DiagnosticFailed"), 10, "the Warning")
            assert "gone without a result" in failed[0]["message"]


async def test_a_diagnostic_whose_job_is_gone_leaves_testing_unknown(
        api: ApiEmulator, tmp_path: Path) -> None:
    async with stopped_during_the_diagnostic(api, tmp_path, "removed-1"):
        (job,) = api.list("Job", DIAG_NS)
        api.remove("Job", job["metadata"]["name"], DIAG_NS)  # by hand, while no agent runs

        async with next_agent(api, tmp_path) as h:
            await eventually(lambda: h.verdict() == "PASS", 10, "out of TESTING")
            status = json.loads(h.annotations()[KEYS.health])["checks"]["dcgm:3"]
            assert status["status"] == "UNKNOWN" and "Job is gone" in status["reason"]
            assert KEYS.dcgm_level(3) not in h.labels()
            await eventually(lambda: h.events("DiagnosticFailed"), 10, "the Warning")


async def test_a_job_without_a_readable_record_is_deleted_not_followed(
        api: ApiEmulator, tmp_path: Path) -> None:
    async with stopped_during_the_diagnostic(api, tmp_path, "garbled-1") as held:
        (job,) = api.list("Job", DIAG_NS)
        job["metadata"]["annotations"][KEYS.diagnostic_run] = "{not json"
        api.put(job)

        async with next_agent(api, tmp_path) as h:
            await eventually(lambda: api.list("Job", DIAG_NS) == [], 10, "the Job deleted")
            await eventually(lambda: h.verdict() == "PASS", 10, "out of TESTING")
            warned = await eventually(lambda: h.events("DiagnosticFailed"), 10, "the Warning")
            assert any("no readable run record" in e["message"] for e in warned)
            assert KEYS.dcgm_level(3) not in h.labels()
    assert held.runs == 1
