"""`DeepDiagnostic`: an exclusive check run as a Job pinned to the node, followed to
its end by watch, its result read from the pod's termination message, the Job always
deleted. The fake kubelet (healthd.sim.kubelet) plays the Job controller, scheduler
and kubelet; its pods REALLY run `healthd check --sim ... --checks dcgm:3`."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from checks.base import Entity, Severity
from healthd.agent.deepdiag import DeepDiagnostic, DiagOutcome, job_manifest
from healthd.config.agent import DeepDiagSettings
from healthd.kube.client import Kube
from healthd.kube.conventions import COMPONENT, GPU_RESOURCE, Keys, Reason
from healthd.kube.events import EventRecorder
from healthd.kube.objects import JOBS
from healthd.sim.apiserver import ApiEmulator
from healthd.sim.kubelet import FakeKubelet, HealthdRunner, Mode, Termination

from .conftest import DIAG_NS, NODE, container, node, pod

pytestmark = pytest.mark.anyio

JOBS_PATH = f"/apis/batch/v1/namespaces/{DIAG_NS}/jobs"


def diagnostic(kube: Kube, job_env: dict[str, str] | None = None,
               **settings: Any) -> DeepDiagnostic:
    values = {"namespace": DIAG_NS, "image": "healthd:test", "schedule_deadline_s": 20.0,
              "run_deadline_s": 60.0, **settings}
    return DeepDiagnostic(kube, NODE, DeepDiagSettings(**values),
                          EventRecorder(kube, component=COMPONENT, host=NODE), job_env=job_env)


@asynccontextmanager
async def kubelet(api: ApiEmulator, **kwargs: Any) -> AsyncIterator[FakeKubelet]:
    fake = FakeKubelet(api, **kwargs)
    async with anyio.create_task_group() as group:
        group.start_soon(fake.run)
        yield fake
        group.cancel_scope.cancel()


async def until(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    with anyio.fail_after(timeout_s):
        while not predicate():
            await anyio.sleep(0.02)


def node_events(api: ApiEmulator) -> list[dict[str, Any]]:
    return [e for e in api.list("Event", "default")
            if e["involvedObject"].get("name") == NODE]


def assert_cleaned_up(api: ApiEmulator) -> None:
    assert api.list("Job", DIAG_NS) == []
    deletes = api.writes("DELETE", rf"{JOBS_PATH}/.+")
    assert len(deletes) == 1
    assert deletes[0].body["propagationPolicy"] == "Background"


async def test_passing_diagnostic(api: ApiEmulator, kube: Kube) -> None:
    api.seed(node())
    async with kubelet(api, runner=HealthdRunner("healthy-8xh100")) as fake:
        outcome = await diagnostic(kube).run("dcgm:3", 8)
        await until(lambda: api.list("Pod", DIAG_NS) == [])  # the Job's pod went with it
    assert outcome.error == ""
    assert outcome.result is not None and outcome.result.status is Severity.PASS
    assert outcome.result.check == "dcgm" and outcome.result.findings == ()
    assert len(fake.jobs_seen) == 1
    assert_cleaned_up(api)
    assert node_events(api) == []


async def test_job_reserves_every_gpu_through_the_scheduler(api: ApiEmulator,
                                                            kube: Kube) -> None:
    api.seed(node())
    async with kubelet(api):
        await diagnostic(kube, {"DCGM_HOST_ENGINE": "10.0.0.9:5555"},
                         priority_class="healthd-diagnostic",
                         runtime_class="nvidia").run("dcgm:3", 8)
    job = api.writes("POST", JOBS_PATH)[0].body
    assert job["metadata"]["generateName"].startswith(f"healthd-diag-{NODE}-")
    assert job["metadata"]["labels"]["healthd.io/diagnostic"] == "true"
    assert job["spec"]["backoffLimit"] == 0 and job["spec"]["activeDeadlineSeconds"] == 80
    spec = job["spec"]["template"]["spec"]
    assert "nodeName" not in spec  # pinned by affinity, so the scheduler counts the GPUs
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": [NODE]}]}]
    assert {"operator": "Exists"} in spec["tolerations"]
    assert spec["restartPolicy"] == "Never" and spec["priorityClassName"] == \
        "healthd-diagnostic"
    assert spec["runtimeClassName"] == "nvidia"
    (main,) = spec["containers"]
    assert {"name": "DCGM_HOST_ENGINE", "value": "10.0.0.9:5555"} in main["env"]
    assert main["resources"] == {"requests": {GPU_RESOURCE: "8"}, "limits": {GPU_RESOURCE: "8"}}
    assert main["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert main["command"][:4] == ["healthd", "check", "--checks", "dcgm:3"]


async def test_failing_diagnostic_reports_findings_per_gpu(api: ApiEmulator, kube: Kube,
                                                           tmp_path: Path) -> None:
    spec = tmp_path / "r3-fail.yaml"
    spec.write_text("node: gpu-node-1\ndcgm:\n  output: v4-fail-r3\n")
    api.seed(node())
    async with kubelet(api, runner=HealthdRunner(spec)):
        outcome = await diagnostic(kube).run("dcgm:3", 8)
    assert outcome.error == "" and outcome.result is not None
    assert outcome.result.status is Severity.EVICT
    found = {(f.code, f.entity, f.severity, f.sticky) for f in outcome.result.findings}
    assert found == {("DCGM_MEMORY", Entity.gpu(2), Severity.EVICT, True),
                     ("DCGM_TARGETED_STRESS", Entity.gpu(5), Severity.ERR, False)}
    assert_cleaned_up(api)


async def expect_failure(api: ApiEmulator, outcome: DiagOutcome, starts: str) -> None:
    assert outcome.result is None
    assert outcome.error.startswith(starts), outcome.error
    (event,) = node_events(api)
    assert event["type"] == "Warning" and event["reason"] == Reason.DIAGNOSTIC_FAILED
    assert starts in event["message"]
    assert api.list("Job", DIAG_NS) == []


async def test_never_scheduled_fails_within_the_deadline(api: ApiEmulator,
                                                         kube: Kube) -> None:
    api.seed(node())
    began = time.monotonic()
    async with kubelet(api, mode=Mode.NEVER_SCHEDULE):
        outcome = await diagnostic(kube, schedule_deadline_s=0.5).run("dcgm:3", 8)
    assert time.monotonic() - began < 10
    await expect_failure(api, outcome, "not scheduled within 0.5 s: 0/1 nodes are available")


async def test_gpus_taken_by_a_workload_keep_the_job_pending(api: ApiEmulator,
                                                             kube: Kube) -> None:
    api.seed(node(), pod("sneaky", containers=[container(limits=1)]))
    async with kubelet(api):
        outcome = await diagnostic(kube, schedule_deadline_s=0.5).run("dcgm:3", 8)
    await expect_failure(api, outcome, "not scheduled within 0.5 s")
    assert f"Insufficient {GPU_RESOURCE}" in outcome.error


async def test_no_pod_at_all(api: ApiEmulator, kube: Kube) -> None:
    outcome = await diagnostic(kube, schedule_deadline_s=0.3).run("dcgm:3", 8)
    await expect_failure(api, outcome, "not scheduled within 0.3 s: no pod was created")


async def test_pod_that_dies_without_a_result(api: ApiEmulator, kube: Kube) -> None:
    api.seed(node())
    async with kubelet(api, mode=Mode.FAIL):
        outcome = await diagnostic(kube).run("dcgm:3", 8)
    await expect_failure(api, outcome, "diagnostic pod failed: Error (exit code 137)")


async def test_crash_logs_reach_the_error(api: ApiEmulator, kube: Kube) -> None:
    async def crash(pod: dict[str, Any]) -> Termination:
        return Termination(1, logs="Traceback ...\nImportError: libdcgm.so.4 not found\n")

    api.seed(node())
    async with kubelet(api, runner=crash):
        outcome = await diagnostic(kube).run("dcgm:3", 8)
    await expect_failure(api, outcome, "diagnostic pod failed: Error (exit code 1)")
    assert "libdcgm.so.4 not found" in outcome.error


async def test_job_is_deleted_when_the_caller_is_cancelled(api: ApiEmulator,
                                                           kube: Kube) -> None:
    api.seed(node())
    async with kubelet(api, run_delay_s=3600):
        async with anyio.create_task_group() as group:
            group.start_soon(diagnostic(kube).run, "dcgm:3", 8)
            await until(lambda: any(p["status"]["phase"] == "Running"
                                    for p in api.list("Pod", DIAG_NS)))
            group.cancel_scope.cancel()
        assert api.list("Job", DIAG_NS) == []
        await until(lambda: api.list("Pod", DIAG_NS) == [])


async def test_job_that_cannot_be_created(api: ApiEmulator, kube: Kube) -> None:
    api.fail("POST", JOBS_PATH, 403)
    outcome = await diagnostic(kube).run("dcgm:3", 8)
    await expect_failure(api, outcome, "cannot create the diagnostic Job: 403")


async def test_no_gpus_no_job(api: ApiEmulator, kube: Kube) -> None:
    outcome = await diagnostic(kube).run("dcgm:3", 0)
    await expect_failure(api, outcome, "no GPUs to reserve")
    assert api.writes("POST", JOBS_PATH) == []


async def test_a_job_handed_over_is_found_and_finished_by_another(api: ApiEmulator,
                                                                  kube: Kube) -> None:
    """A stopping agent leaves its Job running and says nothing; the next one finds it
    (not another node's), reads the result and deletes it."""
    release = anyio.Event()

    async def held(pod: dict[str, Any]) -> Termination:
        await release.wait()
        return await HealthdRunner("healthy-8xh100")(pod)

    api.seed(node(), node("gpu-node-10"))
    stopping = diagnostic(kube)
    others = await kube.create(JOBS, job_manifest("gpu-node-10", "dcgm:3", 8,
                                                  stopping.settings, Keys()))
    async with kubelet(api, runner=held):
        async with anyio.create_task_group() as group:
            group.start_soon(stopping.run, "dcgm:3", 8)
            await until(lambda: sum(p["status"]["phase"] == "Running"
                                    for p in api.list("Pod", DIAG_NS)) == 2)
            stopping.hand_over()
            group.cancel_scope.cancel()
        assert stopping.left == {"dcgm:3"} and len(api.list("Job", DIAG_NS)) == 2
        assert node_events(api) == []
        next_agent = diagnostic(kube)
        (job,) = await next_agent.find()
        assert job["metadata"]["name"] != others["metadata"]["name"]
        release.set()
        outcome = await next_agent.resume(job, "dcgm:3", started=1.0)
    assert outcome.error == "" and outcome.result is not None
    assert outcome.result.status is Severity.PASS and outcome.result.started_at == 1.0
    assert [j["metadata"]["name"] for j in api.list("Job", DIAG_NS)] == \
        [others["metadata"]["name"]]
