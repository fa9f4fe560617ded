"""`healthd trigger` against the API emulator with real in-process agents: batching
(never more than N outstanding, from the emulator's request log), every node
answered and the table right; nodes without an agent time out and are listed; a bad
check list is refused before anything is written; `--job` targets an AppWrapper's
nodes; exclusive checks are refused on busy GPUs unless forced; Ctrl-C stops."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from healthd.sim.apiserver import ApiEmulator
from tests.fleet.fleetlab import KEYS, Run, agent_pod, gpu_node, healthd, pod, running_agents

pytestmark = pytest.mark.anyio

NODE_PATH = r"/api/v1/nodes/[^/]+"


def annotations_set(request: Any) -> dict[str, Any]:
    """The annotations a merge patch sets ({} for any other write)."""
    body = request.body if isinstance(request.body, dict) else {}
    return (body.get("metadata") or {}).get("annotations") or {}


def applied_writes(api: ApiEmulator) -> list[Any]:
    """Node patches the server applied (one refused as stale, 409, changed nothing:
    trigger then re-reads the node and writes again)."""
    return [r for r in api.writes("PATCH", NODE_PATH) if r.status < 300]


def run_writes(api: ApiEmulator) -> list[Any]:
    """The trigger's request writes: merge patches that set healthd.io/run."""
    return [r for r in applied_writes(api) if KEYS.run in annotations_set(r)]


def outstanding_profile(api: ApiEmulator, request_id: str) -> list[int]:
    """Requests written and not yet answered, after each relevant write in log order."""
    outstanding, profile = 0, []
    for r in applied_writes(api):
        annotations = annotations_set(r)
        if annotations.get(KEYS.run_id) == request_id:
            outstanding += 1
        elif request_id in str(annotations.get(KEYS.last_run) or ""):
            outstanding -= 1
        else:
            continue
        profile.append(outstanding)
    return profile


async def test_twenty_nodes_in_batches_of_five(api: ApiEmulator, tmp_path: Path) -> None:
    names = [f"gpu-{i:02d}" for i in range(20)]
    api.seed(*(gpu_node(n) for n in names), gpu_node("cpu-only", labels={"pool": "b"}))
    async with running_agents(api, tmp_path, names):
        run = await healthd(api, tmp_path, "trigger", "--selector", "pool=a",
                            "--checks", "remapped,power", "--batch", "5", "--output", "json")
    assert run.code == 0, run.out + run.err
    report = json.loads(run.out)
    assert [n["node"] for n in report["nodes"]] == names
    for node in report["nodes"]:
        assert (node["state"], node["accepted"], node["verdict_after"]) == (
            "answered", True, "PASS"), node
        assert node["checks"] == {"remapped": "PASS", "power": "PASS"}
        assert node["verdict_before"] == "PASS"
    writes = run_writes(api)
    assert sorted(r.path.rsplit("/", 1)[1] for r in writes) == names  # one write per node
    assert all(r.content_type.startswith("application/merge-patch") for r in writes)
    profile = outstanding_profile(api, report["id"])
    # Never more than the batch outstanding. How many are out at once depends on how
    # fast the agents answer, so "the batch was used" means more than one at a time.
    assert 2 <= max(profile) <= 5, profile
    assert profile[-1] == 0


async def test_the_table_names_verdicts_checks_and_the_exit_code(
        api: ApiEmulator, tmp_path: Path) -> None:
    names = ["gpu-a", "gpu-b"]
    api.seed(*(gpu_node(n) for n in names))
    async with running_agents(api, tmp_path, names):
        run = await healthd(api, tmp_path, "trigger", "--nodes", "gpu-a,gpu-b",
                            "--checks", "remapped", "--wait", tty=True)
    assert run.code == 0, run.err
    lines = run.out.splitlines()
    assert lines[0].split() == ["NODE", "BEFORE", "AFTER", "CHECKS", "DURATION", "ERROR"]
    rows = {line.split()[0]: line.split() for line in lines[1:3]}
    assert rows["gpu-a"][:4] == ["gpu-a", "PASS", "PASS", "remapped=PASS"]
    assert "on 2 nodes: 2 PASS -> PASS, exit 0" in run.out
    assert "trigger: 2/2 done, 0 failed, 0 running" in run.err  # the terminal's progress line


async def test_a_node_without_agent_times_out_and_is_listed(
        api: ApiEmulator, tmp_path: Path) -> None:
    api.seed(gpu_node("gpu-1"), gpu_node("gpu-2"), gpu_node("silent"),
             agent_pod("gpu-1"), agent_pod("gpu-2"))
    async with running_agents(api, tmp_path, ["gpu-1", "gpu-2"]):
        run = await healthd(api, tmp_path, "trigger", "-l", "pool=a", "--checks", "remapped",
                            "--wait", "--timeout", "2s")
    assert run.code == 3, run.out
    row = next(line for line in run.out.splitlines() if line.startswith("silent"))
    assert "no agent answered within 2s; no agent pod runs there (request withdrawn)" in row
    assert "1 no agent answered (silent)" in run.out and "2 PASS" in run.out
    annotations = api.get("Node", "silent")["metadata"]["annotations"]
    assert KEYS.run not in annotations and KEYS.run_id not in annotations  # no stale request


@pytest.mark.parametrize(("checks", "error"), [
    ("remaped", "unknown check remaped"),
    ("dcgm:9", "dcgm:9"),
    ("all,power", "cannot be combined"),
])
async def test_a_bad_request_is_refused_before_anything_is_written(
        api: ApiEmulator, tmp_path: Path, checks: str, error: str) -> None:
    api.seed(gpu_node("gpu-1"))
    run = await healthd(api, tmp_path, "trigger", "--nodes", "gpu-1", "--checks", checks)
    assert run.code == 64
    assert error in run.err
    assert api.requests == []  # refused before even connecting


async def test_job_targets_the_nodes_of_an_appwrapper(api: ApiEmulator, tmp_path: Path) -> None:
    names = ["gpu-1", "gpu-2", "gpu-3", "gpu-4"]
    api.seed(*(gpu_node(n) for n in names))
    api.seed({"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper",
              "metadata": {"name": "train", "namespace": "team"}, "spec": {}},
             *(pod(f"train-{i}", node, gpus=8,
                   labels={"workload.codeflare.dev/appwrapper": "train"})
               for i, node in enumerate(["gpu-2", "gpu-4", "gpu-2"])))
    async with running_agents(api, tmp_path, ["gpu-2", "gpu-4"]):
        run = await healthd(api, tmp_path, "trigger", "--job", "team/train",
                            "--checks", "power", "--wait", "--output", "json")
    assert run.code == 0, run.out + run.err
    assert [n["node"] for n in json.loads(run.out)["nodes"]] == ["gpu-2", "gpu-4"]
    assert sorted(r.path.rsplit("/", 1)[1] for r in run_writes(api)) == ["gpu-2", "gpu-4"]


async def test_job_that_does_not_exist_is_a_usage_error(api: ApiEmulator,
                                                        tmp_path: Path) -> None:
    api.seed(gpu_node("gpu-1"))
    run = await healthd(api, tmp_path, "trigger", "--job", "team/nope", "--checks", "power")
    assert (run.code, run_writes(api)) == (64, [])
    assert "no AppWrapper team/nope" in run.err


async def test_exclusive_checks_are_refused_on_busy_gpus(api: ApiEmulator,
                                                         tmp_path: Path) -> None:
    api.seed(gpu_node("busy"), gpu_node("idle"), pod("train-0", "busy", gpus=4),
             pod("done", "idle", gpus=8, phase="Succeeded"))
    run = await healthd(api, tmp_path, "trigger", "-l", "pool=a", "--checks", "dcgm:3")
    assert run.code == 3
    busy = next(line for line in run.out.splitlines() if line.startswith("busy"))
    assert "refused" in busy and "team/train-0" in busy
    assert [r.path for r in run_writes(api)] == ["/api/v1/nodes/idle"]
    idle = api.get("Node", "idle")["metadata"]["annotations"]
    assert idle[KEYS.run] == "dcgm:3" and idle[KEYS.run_id].startswith("trigger-")


async def test_force_queue_asks_busy_nodes_anyway(api: ApiEmulator, tmp_path: Path) -> None:
    api.seed(gpu_node("busy"), pod("train-0", "busy", gpus=4))
    run = await healthd(api, tmp_path, "trigger", "--nodes", "busy", "--checks", "dcgm:3",
                        "--force-queue")
    assert run.code == 0, run.out + run.err  # placed, not awaited
    assert [r.path for r in run_writes(api)] == ["/api/v1/nodes/busy"]


async def test_interrupt_stops_issuing_and_reports_what_came_back(
        api: ApiEmulator, tmp_path: Path) -> None:
    names = [f"gpu-{i}" for i in range(6)]
    api.seed(*(gpu_node(n) for n in names))
    stop = anyio.Event()

    async def press_ctrl_c() -> None:
        while len(run_writes(api)) < 2:
            await anyio.sleep(0.02)
        stop.set()

    async with anyio.create_task_group() as group:
        group.start_soon(press_ctrl_c)
        run = await healthd(api, tmp_path, "trigger", "-l", "pool=a", "--checks", "power",
                            "--batch", "2", "--output", "json", stop=stop)
    assert run.code == 3
    states = [n["state"] for n in json.loads(run.out)["nodes"]]
    assert states == ["interrupted"] * 2 + ["not-asked"] * 4
    assert len(run_writes(api)) == 2


OTHER = {KEYS.run: "dcgm:3", KEYS.run_id: "admin-42"}  # someone else's, not yet taken


def run_annotations(api: ApiEmulator, node: str) -> dict[str, str]:
    annotations = api.get("Node", node)["metadata"].get("annotations") or {}
    return {k: v for k, v in annotations.items() if k in (KEYS.run, KEYS.run_id)}


def another_admin_asks(api: ApiEmulator, node: str) -> None:
    """OTHER's request written on `node`, as `kubectl annotate` would."""
    obj = api.get("Node", node)
    obj["metadata"]["annotations"].update(OTHER)
    api.put(obj)


async def trigger_racing_another_admin(api: ApiEmulator, tmp_path: Path, *argv: str,
                                      asks: str, once_trigger_asked: str) -> Run:
    """`healthd trigger ARGV` while another admin writes OTHER's request on `asks` as
    soon as trigger's own request is on `once_trigger_asked`."""
    async def other_admin() -> None:
        while KEYS.run not in run_annotations(api, once_trigger_asked):
            await anyio.sleep(0.01)
        another_admin_asks(api, asks)

    async with anyio.create_task_group() as group:
        group.start_soon(other_admin)
        run = await healthd(api, tmp_path, "trigger", *argv)
        group.cancel_scope.cancel()
    return run


async def test_a_request_still_pending_on_a_node_is_not_overwritten(
        api: ApiEmulator, tmp_path: Path) -> None:
    # gpu-1's agent is busy (its pod runs, but it has not taken the request waiting
    # there); gpu-2's agent answers.
    api.seed(gpu_node("gpu-1", annotations=OTHER), gpu_node("gpu-2"),
             agent_pod("gpu-1"), agent_pod("gpu-2"))
    async with running_agents(api, tmp_path, ["gpu-2"]):
        api.clear_log()
        run = await healthd(api, tmp_path, "trigger", "--nodes", "gpu-1,gpu-2",
                            "--checks", "remapped", "--wait", "--timeout", "5s")
    assert run.code == 3, run.out  # gpu-1 was not asked: UNKNOWN
    row = next(line for line in run.out.splitlines() if line.startswith("gpu-1 "))
    assert "another request is pending" in row and "not asked" in row
    assert "1 another request pending (gpu-1)" in run.out and "1 PASS" in run.out
    assert run_annotations(api, "gpu-1") == OTHER  # neither overwritten nor withdrawn
    assert api.writes("PATCH", "/api/v1/nodes/gpu-1") == []


async def test_a_request_written_while_trigger_waits_for_its_turn_is_kept(
        api: ApiEmulator, tmp_path: Path) -> None:
    # --batch 1: `late` is asked only when `silent` times out. Meanwhile another admin
    # asks `late` for something else: trigger sees it (its watch keeps the nodes
    # fresh) and leaves that request alone.
    api.seed(gpu_node("silent"), gpu_node("late"), agent_pod("silent"), agent_pod("late"))
    run = await trigger_racing_another_admin(
        api, tmp_path, "--nodes", "silent,late", "--checks", "remapped", "--batch", "1",
        "--timeout", "1s", "-o", "json", asks="late", once_trigger_asked="silent")
    late = next(n for n in json.loads(run.out)["nodes"] if n["node"] == "late")
    assert late["state"] == "occupied" and "'dcgm:3' (admin-42)" in late["error"]
    assert run_annotations(api, "late") == OTHER
    assert [r.path for r in run_writes(api)] == ["/api/v1/nodes/silent"]
    assert run_annotations(api, "silent") == {}  # its own request withdrawn on timeout


async def test_a_request_written_just_before_trigger_writes_is_kept(
        api: ApiEmulator, tmp_path: Path) -> None:
    # Trigger's write reaches the server a second late (a slow API server); another
    # admin's request lands first. The write carries the resourceVersion trigger
    # read: it is refused as stale (409), trigger re-reads the node and leaves it.
    api.seed(gpu_node("gpu-1"), agent_pod("gpu-1"))
    api.fail("PATCH", "/api/v1/nodes/gpu-1", status=None, delay=1.0)

    async def another_admin_asks_first() -> None:
        while not api.requests_to("GET", "/api/v1/namespaces/[^/]+/pods"):  # its last read
            await anyio.sleep(0.01)
        another_admin_asks(api, "gpu-1")

    async with anyio.create_task_group() as group:
        group.start_soon(another_admin_asks_first)
        run = await healthd(api, tmp_path, "trigger", "--nodes", "gpu-1", "--checks",
                            "remapped", "-o", "json")
    [node] = json.loads(run.out)["nodes"]
    assert node["state"] == "occupied" and "'dcgm:3' (admin-42)" in node["error"]
    assert run_annotations(api, "gpu-1") == OTHER
    assert [r.status for r in api.writes("PATCH", "/api/v1/nodes/gpu-1")] == [409]


async def test_on_timeout_only_its_own_request_is_withdrawn(
        api: ApiEmulator, tmp_path: Path) -> None:
    api.seed(gpu_node("silent"), agent_pod("silent"))
    run = await trigger_racing_another_admin(
        api, tmp_path, "--nodes", "silent", "--checks", "remapped", "--wait", "--timeout",
        "1s", "-o", "wide", asks="silent", once_trigger_asked="silent")
    assert run.code == 3
    assert "another request replaced it before the agent took it: left in place" in run.out
    assert run_annotations(api, "silent") == OTHER


async def test_a_silent_testing_node_says_its_agent_is_busy(
        api: ApiEmulator, tmp_path: Path) -> None:
    api.seed(gpu_node("diagnosing", verdict="TESTING"), agent_pod("diagnosing"))
    run = await healthd(api, tmp_path, "trigger", "--nodes", "diagnosing", "--checks",
                        "remapped", "--wait", "--timeout", "1s", "-o", "wide")
    assert run.code == 3
    assert ("no agent answered within 1s; the node is TESTING: its agent is busy with a "
            "deep diagnostic and takes one request at a time (request withdrawn)") in run.out
    assert run_annotations(api, "diagnosing") == {}


async def test_progress_goes_to_stderr_when_stdout_is_not_a_terminal(
        api: ApiEmulator, tmp_path: Path) -> None:
    names = ["gpu-a", "gpu-b"]
    api.seed(*(gpu_node(n) for n in names))
    async with running_agents(api, tmp_path, names):
        run = await healthd(api, tmp_path, "trigger", "--nodes", ",".join(names),
                            "--checks", "remapped", "--wait")
    assert run.code == 0, run.out + run.err
    assert run.out.startswith("NODE"), run.out  # the table alone on stdout
    answered = sorted(line.split(":")[0] for line in run.err.splitlines() if line.strip())
    assert answered == names  # one progress line per node, on stderr
