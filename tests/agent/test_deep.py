"""Deep diagnostics end to end: `healthd.io/run=dcgm:3` is refused (naming the pods)
while pods hold the GPUs; on free GPUs the node shows TESTING, a Job pinned to it runs
`healthd check --checks dcgm:3` (really, on the simulated machine, through the fake
kubelet), the result lands in the verdict and the dcgm.level.3 label, and the Job is
deleted; a Job that never gets scheduled takes the node back out of TESTING."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from healthd.sim.apiserver import ApiEmulator
from healthd.sim.kubelet import FakeKubelet, HealthdRunner, Mode
from healthd.sim.machine import MachineSpec, load_machine_spec
from tests.agent.harness import KEYS, NODE, Harness, eventually, fast_config, running_agent

pytestmark = pytest.mark.anyio

DIAG_NS = "healthd-system"


def spec_with_dcgm(output: str) -> MachineSpec:
    spec = load_machine_spec("healthy-8xh100")
    return spec.model_copy(update={"node": NODE, "dcgm": spec.dcgm.model_copy(
        update={"output": output})})


def gpu_pod(name: str, phase: str = "Running") -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "research"},
        "spec": {"nodeName": NODE, "containers": [{
            "name": "train", "image": "trainer",
            "resources": {"limits": {"nvidia.com/gpu": "4"}}}]},
        "status": {"phase": phase},
    }


@asynccontextmanager
async def kubelet(api: ApiEmulator, spec: MachineSpec, tmp_path: Path,
                  **kwargs: Any) -> AsyncIterator[FakeKubelet]:
    spec_file = tmp_path / "machine.yaml"
    spec_file.write_text(spec.model_dump_json())
    fake = FakeKubelet(api, runner=HealthdRunner(spec_file), **kwargs)
    async with anyio.create_task_group() as group:
        group.start_soon(fake.run)
        yield fake
        group.cancel_scope.cancel()


def verdicts_written(h: Harness) -> list[str]:
    """Every value of the verdict label the agent wrote, in order."""
    out = []
    for request in h.node_writes():
        if not isinstance(request.body, dict):
            continue  # JSON patches (taking requests) never carry the label
        labels = (request.body.get("metadata") or {}).get("labels") or {}
        if KEYS.gpuhealth in labels:
            out.append(labels[KEYS.gpuhealth])
    return out


async def test_busy_gpus_refuse_the_diagnostic_and_name_the_pods(
        api: ApiEmulator, tmp_path: Path) -> None:
    api.seed(gpu_pod("trainer-0"), gpu_pod("finished", phase="Succeeded"))
    async with running_agent(api, tmp_path) as h:
        await eventually(lambda: h.verdict() == "PASS", what="PASS label")
        h.request("dcgm:3", run_id="deep-1")
        answer = await eventually(lambda: (a := h.last_run()) and a["id"] == "deep-1" and a,
                                  what="answer")
        assert answer["accepted"] is False
        assert "research/trainer-0" in answer["error"] and "finished" not in answer["error"]
        await eventually(lambda: h.events("BadHealthRequest"), what="Warning Event")
        assert api.writes("POST", r"/jobs") == []
        assert "TESTING" not in verdicts_written(h)
        assert h.verdict() == "PASS"


async def test_free_gpus_run_the_diagnostic_as_a_job_and_publish_its_result(
        api: ApiEmulator, tmp_path: Path) -> None:
    spec = spec_with_dcgm("v4-pass-r3")
    config = fast_config(deep_diagnostics={"namespace": DIAG_NS, "image": "healthd:test"})
    async with kubelet(api, spec, tmp_path) as fake, running_agent(
            api, tmp_path, spec=spec, config=config) as h:
        h.request("dcgm:3", run_id="deep-2")
        answer = await eventually(lambda: (a := h.last_run()) and a["id"] == "deep-2" and a,
                                  60, "answer")
        assert (answer["accepted"], answer["checks"]) == (True, {"dcgm:3": "PASS"}), answer
        assert fake.jobs_seen, "no Job was created"
        assert "TESTING" in verdicts_written(h)
        assert h.verdict() == "PASS"
        assert h.labels()[KEYS.dcgm_level(3)].startswith("PASS_")
        await eventually(lambda: api.list("Job", DIAG_NS) == [], what="Job deleted")
        await eventually(lambda: h.events("DiagnosticRunning"), what="TESTING Event")


async def test_the_job_asks_the_host_engine_the_agent_is_configured_with(
        api: ApiEmulator, tmp_path: Path) -> None:
    """The machine's host engine answers only at one address; the Job's pod reaches it
    because the agent hands its own `host_engine` down."""
    base = spec_with_dcgm("v4-pass-r3")
    spec = base.model_copy(update={"dcgm": base.dcgm.model_copy(
        update={"host_engine": "10.0.0.9:5555"})})
    config = fast_config(deep_diagnostics={"namespace": DIAG_NS, "image": "healthd:test"})
    checks = {**config.checks, "dcgm": config.checks["dcgm"].model_copy(
        update={"params": {"host_engine": "10.0.0.9:5555"}})}
    config = config.model_copy(update={"checks": checks})
    async with kubelet(api, spec, tmp_path), running_agent(
            api, tmp_path, spec=spec, config=config) as h:
        h.request("dcgm:3", run_id="deep-remote")
        answer = await eventually(lambda: (a := h.last_run()) and a["id"] == "deep-remote"
                                  and a, 60, "answer")
        assert answer["checks"] == {"dcgm:3": "PASS"}, answer
        (job,) = [w.body for w in api.writes("POST", r".*/jobs")]
        env = job["spec"]["template"]["spec"]["containers"][0]["env"]
        assert {"name": "DCGM_HOST_ENGINE", "value": "10.0.0.9:5555"} in env


@asynccontextmanager
async def never_scheduled(api: ApiEmulator, tmp_path: Path) -> AsyncIterator[Harness]:
    """An agent at PASS whose diagnostic Jobs never get a node (0.5 s deadline)."""
    spec = spec_with_dcgm("v4-pass-r3")
    config = fast_config(deep_diagnostics={"namespace": DIAG_NS, "schedule_deadline_s": 0.5})
    async with kubelet(api, spec, tmp_path, mode=Mode.NEVER_SCHEDULE), running_agent(
            api, tmp_path, spec=spec, config=config) as h:
        await eventually(lambda: h.verdict() == "PASS", what="PASS label")
        yield h


async def test_a_job_that_is_never_scheduled_ends_testing_with_an_event(
        api: ApiEmulator, tmp_path: Path) -> None:
    async with never_scheduled(api, tmp_path) as h:
        h.request("dcgm:3", run_id="deep-3")
        answer = await eventually(lambda: (a := h.last_run()) and a["id"] == "deep-3" and a,
                                  20, "answer")
        assert answer["checks"] == {"dcgm:3": "UNKNOWN"}
        assert "TESTING" in verdicts_written(h)
        await eventually(lambda: h.verdict() == "PASS", what="back to PASS")
        failed = await eventually(lambda: h.events("DiagnosticFailed"), what="failure Event")
        assert "not scheduled" in failed[0]["message"]
        assert KEYS.dcgm_level(3) not in h.labels()
        await eventually(lambda: api.list("Job", DIAG_NS) == [], what="Job deleted")


async def test_a_configured_diagnostic_runs_on_its_schedule_not_at_start(
        api: ApiEmulator, tmp_path: Path) -> None:
    spec = spec_with_dcgm("v4-fail-r3")  # memory fails on GPU 2: a fatal DCGM test
    config = fast_config(deep_diagnostics={"namespace": DIAG_NS},
                         diagnostics=[{"check": "dcgm:3", "interval": 1.5}])
    async with kubelet(api, spec, tmp_path) as fake, running_agent(
            api, tmp_path, spec=spec, config=config) as h:
        assert fake.jobs_seen == []  # ready, and no diagnostic at start
        await eventually(lambda: h.verdict() == "EVICT", 30, "the diagnostic's verdict")
        assert h.labels()[KEYS.dcgm_level(3)].startswith("ERR_")
        assert "TESTING" in verdicts_written(h)
        held = {(x.code, x.entity) for x in h.parts.health.state.held}
        assert ("DCGM_MEMORY", "gpu2") in held


async def test_a_diagnostic_that_never_ran_says_why_everywhere_a_person_looks(
        api: ApiEmulator, tmp_path: Path) -> None:
    async with never_scheduled(api, tmp_path) as h:
        admin = api.write_kubeconfig(tmp_path / "admin.kubeconfig")
        trigger = await anyio.run_process(
            [sys.executable, "-m", "healthd.cli", "trigger", "--nodes", NODE, "--checks",
             "dcgm:3", "--wait", "--timeout", "30s", "--kubeconfig", str(admin)], check=False)
        failed = await eventually(lambda: h.events("DiagnosticFailed"), what="failure Event")
    # trigger's table: the UNKNOWN and its reason
    assert trigger.returncode == 3
    [row] = [line for line in trigger.stdout.decode().splitlines()
             if line.startswith(f"{NODE} ") and "dcgm:3=UNKNOWN" in line]
    assert "dcgm:3: not scheduled within 0.5 s" in row
    # last-run: the same reason
    answer = h.last_run()
    assert answer["checks"] == {"dcgm:3": "UNKNOWN"} and answer["error"] == ""
    assert "not scheduled within 0.5 s" in answer["reasons"]["dcgm:3"]
    # the Warning Event names the Node by uid, so `kubectl describe node` lists it
    assert failed[0]["involvedObject"]["uid"] == h.node()["metadata"]["uid"]
    assert failed[0]["involvedObject"]["kind"] == "Node"
