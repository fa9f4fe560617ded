"""`healthd status` on a seeded cluster: one row per GPU node with the verdict, its
age, the codes that hold it, the last round's age and whether an agent runs there;
filters; the controller's view (lending per flavor, breaker, recent resets, leader);
a JSON document whose keys are pinned (schema_version 1); `--watch` redraws."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from healthd.cli import build_parser
from healthd.fleet.command import status_command
from healthd.fleet.render import repair_text
from healthd.kube.conventions import Keys
from healthd.sim.apiserver import ApiEmulator
from tests.agent.harness import eventually
from tests.fleet.fleetlab import KEYS, agent_pod, gpu_node, healthd, pod

pytestmark = pytest.mark.anyio

NOW = 1_750_000_000.0  # the status view's clock


def stamp(ago_s: float) -> str:
    from healthd.util.times import rfc3339

    return rfc3339(NOW - ago_s)


def health(verdict: str, *, since_ago: float, round_ago: float,
           held: tuple[tuple[str, str], ...] = (), flaps: int = 0) -> str:
    return json.dumps({
        "verdict": verdict, "since": stamp(since_ago), "top": held[0][0] if held else None,
        "held": [{"code": c, "check": "x", "entity": "gpu3", "severity": s, "sticky": False,
                  "message": "m", "since": stamp(since_ago), **({"flaps": flaps} if flaps else {})}
                 for c, s in held],
        "findings": [],
        "checks": {"remapped": {"status": "PASS", "at": stamp(round_ago + 30)},
                   "power": {"status": "PASS", "at": stamp(round_ago)}},
    })


def event(name: str, reason: str, ago_s: float, *, kind: str = "AppWrapper",
          namespace: str = "team", message: str = "") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": {"kind": kind, "name": name.split(".")[0], "namespace": namespace},
            "reason": reason, "type": "Warning", "message": message or reason,
            "firstTimestamp": stamp(ago_s), "lastTimestamp": stamp(ago_s), "count": 1}


def seed_cluster(api: ApiEmulator) -> None:
    api.seed(
        gpu_node("n-pass", verdict="PASS",
                 annotations={KEYS.health: health("PASS", since_ago=7200, round_ago=20)}),
        gpu_node("n-evict", verdict="EVICT", annotations={KEYS.health: health(
            "EVICT", since_ago=300, round_ago=45,
            held=(("XID_79", "EVICT"), ("REMAP_PENDING", "ERR"))), KEYS.repair: json.dumps({
                "state": "waiting", "since": stamp(60),
                "reason": "1 running pod(s) still hold the node's GPUs",
                "attempts": [{"remedy": "reset", "at": stamp(4000), "gpus": ["GPU-3"],
                              "outcome": "passed"}]})}),
        gpu_node("n-err", verdict="ERR", unschedulable=True, labels={"pool": "b"},
                 annotations={KEYS.health: health("ERR", since_ago=90, round_ago=5,
                                                  held=(("REMAP_PENDING", "ERR"),), flaps=3)}),
        gpu_node("n-unknown", annotations={KEYS.health: health("UNKNOWN", since_ago=10,
                                                                  round_ago=10)}),
        gpu_node("n-new"),
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "cpu-1"},
         "status": {"capacity": {"cpu": "64"}}},
        agent_pod("n-pass"), agent_pod("n-evict"),
        agent_pod("n-err", ready=False, restarts=3, restarted_at=stamp(120)),
        {**agent_pod("n-unknown"), "status": {"phase": "Pending"}},
        pod("train-0", "n-evict", gpus=8),
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
         "metadata": {"name": "pool-a"}, "spec": {"nodeLabels": {"pool": "a"}}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
         "metadata": {"name": "pool-b"}, "spec": {"nodeLabels": {"pool": "b"}}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
         "metadata": {"name": "slack-cluster-queue"},
         "spec": {"cohortName": "all", "resourceGroups": [{
             "coveredResources": ["nvidia.com/gpu"],
             "flavors": [
                 {"name": "pool-a", "resources": [
                     {"name": "nvidia.com/gpu", "nominalQuota": "32", "lendingLimit": "24"}]},
                 {"name": "pool-b", "resources": [
                     {"name": "nvidia.com/gpu", "nominalQuota": "4"}]}]}]}},
        {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
         "metadata": {"name": "healthd-controller", "namespace": "healthd-system"},
         "spec": {"holderIdentity": "healthd-controller-7f9c", "leaseDurationSeconds": 15,
                  "renewTime": stamp(2)}},
        event("train.1", "NodeEvicted", 600, message="Reset: n-evict XID_79"),
        event("old.1", "NodeEvicted", 7200),
        event("healthd-controller.1", "ResetBreakerClosed", 1000, kind="Lease",
              namespace="healthd-system"),
        event("healthd-controller.2", "ResetBreakerOpen", 100, kind="Lease",
              namespace="healthd-system", message="4 of 5 GPU nodes bad"),
    )


async def status_json(api: ApiEmulator, tmp_path: Path, *args: str) -> dict[str, Any]:
    run = await healthd(api, tmp_path, "status", "--output", "json", *args,
                        clock=lambda: NOW)
    assert run.code == 0, run.err
    return json.loads(run.out)


async def test_one_row_per_gpu_node_with_verdict_ages_codes_and_agent(
        api: ApiEmulator, tmp_path: Path) -> None:
    seed_cluster(api)
    doc = await status_json(api, tmp_path)
    rows = {r["name"]: r for r in doc["nodes"]}
    assert list(rows) == ["n-err", "n-evict", "n-new", "n-pass", "n-unknown"]  # no cpu-1
    assert {n: r["verdict"] for n, r in rows.items()} == {
        "n-err": "ERR", "n-evict": "EVICT", "n-new": "NONE", "n-pass": "PASS",
        "n-unknown": "UNKNOWN"}
    assert rows["n-evict"]["top_codes"] == ["XID_79", "REMAP_PENDING"]
    assert {n: r["flaps"] for n, r in rows.items()} == {
        "n-err": 3, "n-evict": 0, "n-new": 0, "n-pass": 0, "n-unknown": 0}
    assert (rows["n-evict"]["since_age_s"], rows["n-evict"]["last_round_age_s"]) == (300, 45)
    assert (rows["n-pass"]["since_age_s"], rows["n-pass"]["last_round_age_s"]) == (7200, 20)
    assert rows["n-new"]["since"] is None and rows["n-new"]["last_round_age_s"] is None
    assert {n for n, r in rows.items() if r["agent"]} == {"n-pass", "n-evict", "n-err"}
    assert rows["n-err"]["cordoned"] is True and rows["n-pass"]["cordoned"] is False
    assert {n: (r["agent_ready"], r["agent_restarts"], r["agent_restarted_age_s"])
            for n, r in rows.items()} == {
        "n-pass": (True, 0, None), "n-evict": (True, 0, None), "n-err": (False, 3, 120),
        "n-unknown": (False, 0, None), "n-new": (None, None, None)}
    assert doc["summary"] == {"nodes": 5, "gpu_nodes": 5, "without_agent": 2,
                              "agent_not_ready": 1, "verdicts": {
        "PASS": 1, "WARN": 0, "ERR": 1, "TESTING": 0, "EVICT": 1, "UNKNOWN": 1, "NONE": 1}}


async def test_the_controller_view(api: ApiEmulator, tmp_path: Path) -> None:
    seed_cluster(api)
    view = (await status_json(api, tmp_path))["controller"]
    assert view["kueue"] == "kueue.x-k8s.io/v1beta2"
    assert view["lending"] == [
        {"queue": "slack-cluster-queue", "flavor": "pool-a", "resource": "nvidia.com/gpu",
         "nominal": "32", "lending_limit": "24", "due": "24", "unavailable": "8",
         "shortfall": "0", "nodes": ["n-evict"]},
        {"queue": "slack-cluster-queue", "flavor": "pool-b", "resource": "nvidia.com/gpu",
         "nominal": "4", "lending_limit": None, "due": "0", "unavailable": "8",
         "shortfall": "4", "nodes": ["n-err"]},
    ]
    assert view["breaker"]["state"] == "open"
    assert view["breaker"]["message"] == "4 of 5 GPU nodes bad"
    assert view["resets_last_hour"] == 1
    assert view["resets"] == [{"appwrapper": "team/train", "at": stamp(600),
                               "message": "Reset: n-evict XID_79"}]
    assert view["leader"] == {"holder": "healthd-controller-7f9c", "renewed": stamp(2),
                              "expired": False}
    assert view["problems"] == []


async def test_filters_by_selector_and_verdict(api: ApiEmulator, tmp_path: Path) -> None:
    seed_cluster(api)
    doc = await status_json(api, tmp_path, "--selector", "pool=a", "--verdict", "evict,none")
    assert [r["name"] for r in doc["nodes"]] == ["n-evict", "n-new"]
    assert doc["filters"] == {"selector": "pool=a", "verdicts": ["EVICT", "NONE"]}
    assert len(doc["controller"]["lending"]) == 2  # lending always counts every node


async def test_a_bad_verdict_filter_is_a_usage_error(api: ApiEmulator, tmp_path: Path) -> None:
    run = await healthd(api, tmp_path, "status", "--verdict", "BROKEN")
    assert run.code == 64 and "choose among" in run.err


GOLDEN_TOP = ["controller", "filters", "generated_at", "nodes", "schema_version", "summary"]
GOLDEN_NODE = ["agent", "agent_pod", "agent_ready", "agent_restarted_age_s", "agent_restarts",
               "blamed", "cordoned", "flaps", "gpus", "health_unreadable", "last_round",
               "last_round_age_s", "name", "ready", "repair", "since", "since_age_s", "top_codes",
               "verdict"]
GOLDEN_CONTROLLER = ["breaker", "kueue", "leader", "lending", "network", "problems", "resets",
                     "resets_last_hour"]
GOLDEN_NETWORK = ["blamed", "isolated", "partitioned", "reporters", "why"]
GOLDEN_LENDING = ["due", "flavor", "lending_limit", "nodes", "nominal", "queue", "resource",
                  "shortfall", "unavailable"]


async def test_the_json_schema_is_stable(api: ApiEmulator, tmp_path: Path) -> None:
    seed_cluster(api)
    doc = await status_json(api, tmp_path)
    assert doc["schema_version"] == 1
    assert sorted(doc) == GOLDEN_TOP
    assert all(sorted(row) == GOLDEN_NODE for row in doc["nodes"])
    assert sorted(doc["controller"]) == GOLDEN_CONTROLLER
    assert all(sorted(row) == GOLDEN_LENDING for row in doc["controller"]["lending"])
    assert sorted(doc["controller"]["breaker"]) == ["message", "since", "state"]
    assert sorted(doc["controller"]["network"]) == GOLDEN_NETWORK
    assert sorted(doc["controller"]["resets"][0]) == ["appwrapper", "at", "message"]
    assert sorted(doc["summary"]) == ["agent_not_ready", "gpu_nodes", "nodes", "verdicts",
                                      "without_agent"]


async def test_each_node_shows_its_repair(api: ApiEmulator, tmp_path: Path) -> None:
    seed_cluster(api)
    doc = await status_json(api, tmp_path)
    rows = {row["name"]: row for row in doc["nodes"]}
    assert rows["n-evict"]["repair"] == {
        "state": "waiting", "since": stamp(60), "since_age_s": 60.0, "gpus": [],
        "reason": "1 running pod(s) still hold the node's GPUs", "attempts": 1}
    assert rows["n-pass"]["repair"] is None


def test_a_repair_reads_as_its_state_its_gpus_and_its_age() -> None:
    resetting = {"state": "resetting", "since_age_s": 120.0,
                 "gpus": ["GPU-9cf5b221-73ea-4e88-80f8-1f2e4929bb78"]}
    assert repair_text(resetting) == "resetting GPU-9cf5b221 2m"
    assert repair_text({"state": "reboot-requested", "since_age_s": 240.0,
                        "gpus": []}) == "reboot-requested 4m"
    assert repair_text({"state": "", "since_age_s": 5.0}) == "-"
    assert repair_text(None) == "-"


async def test_the_table(api: ApiEmulator, tmp_path: Path) -> None:
    seed_cluster(api)
    run = await healthd(api, tmp_path, "status", clock=lambda: NOW)
    lines = run.out.splitlines()
    assert lines[0].split() == ["NODE", "VERDICT", "SINCE", "TOP", "CODES", "FLAPS", "AGENT",
                                "RESTARTS", "BLAMED", "REPAIR", "NOTES"]
    assert lines[2].split() == ["n-evict", "EVICT", "5m", "XID_79,REMAP_PENDING", "-", "ready",
                                "0", "-", "waiting", "1m", "-"]
    assert lines[1].split() == ["n-err", "ERR", "1m30s", "REMAP_PENDING", "3", "NOT", "READY",
                                "3", "(2m", "ago)", "-", "-", "cordoned"]
    assert lines[3].split()[:7] == ["n-new", "NONE", "-", "-", "-", "NONE", "-"]
    assert "5 GPU nodes: " in run.out and "; 1 with an agent that is not ready" in run.out
    assert "reset breaker open" in run.out and "1 AppWrapper reset in the last hour" in run.out
    assert "8 (short 4)" in run.out


async def test_without_kueue_or_events_the_rest_still_shows(api: ApiEmulator,
                                                           tmp_path: Path) -> None:
    api.seed(gpu_node("n-1", verdict="PASS"))
    api.serve("kueue.x-k8s.io/v1beta2", False)
    api.serve("kueue.x-k8s.io/v1beta1", False)
    api.fail("GET", r"/api/v1/events", 403, times=3)
    doc = await status_json(api, tmp_path)
    assert [r["name"] for r in doc["nodes"]] == ["n-1"]
    assert doc["controller"]["kueue"] is None and doc["controller"]["lending"] == []
    assert any("events NodeEvicted" in p for p in doc["controller"]["problems"])


async def test_watch_redraws_on_change(api: ApiEmulator, tmp_path: Path) -> None:
    seed_cluster(api)
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    args = build_parser().parse_args(["status", "--watch", "--output", "json",
                                      "--kubeconfig", str(kubeconfig)])
    out = io.StringIO()

    def verdict_of(node: str) -> str | None:
        docs = [json.loads(line) for line in out.getvalue().splitlines() if line]
        rows = [r for r in docs[-1]["nodes"] if r["name"] == node] if docs else []
        return rows[0]["verdict"] if rows else None

    async with anyio.create_task_group() as group:
        group.start_soon(lambda: status_command(args, out=out, clock=lambda: NOW))
        await eventually(lambda: verdict_of("n-new") == "NONE", 10, "first draw")
        node = api.get("Node", "n-new")
        node["metadata"]["labels"][Keys().gpuhealth] = "WARN"
        api.put(node)
        await eventually(lambda: verdict_of("n-new") == "WARN", 10, "redraw")
        group.cancel_scope.cancel()


async def test_one_of_a_kind_reads_in_the_singular(api: ApiEmulator, tmp_path: Path) -> None:
    api.seed(gpu_node("n-1", verdict="PASS"), agent_pod("n-1"),
             event("train.1", "NodeEvicted", 60))
    run = await healthd(api, tmp_path, "status", clock=lambda: NOW)
    assert "\n1 GPU node: 1 PASS\n" in run.out
    assert "1 AppWrapper reset in the last hour" in run.out


NESTED = "[" * 100_000 + "]" * 100_000  # valid JSON, far deeper than any decoder recurses


async def test_a_node_whose_health_annotation_is_garbage_reads_as_unreadable(
        api: ApiEmulator, tmp_path: Path) -> None:
    api.seed(gpu_node("n-garbage", verdict="PASS", annotations={KEYS.health: NESTED}),
             gpu_node("n-pass", verdict="PASS", annotations={
                 KEYS.health: health("PASS", since_ago=60, round_ago=5)}))
    doc = await status_json(api, tmp_path)
    rows = {r["name"]: r for r in doc["nodes"]}
    assert rows["n-garbage"]["verdict"] == "PASS"  # the label still says what it says
    assert "nested deeper than" in rows["n-garbage"]["health_unreadable"]
    assert rows["n-pass"]["health_unreadable"] is None
    run = await healthd(api, tmp_path, "status", clock=lambda: NOW)
    assert run.code == 0 and "Traceback" not in run.err
    garbage = next(line for line in run.out.splitlines() if line.startswith("n-garbage"))
    assert garbage.rstrip().endswith("health unreadable")


async def test_a_verdict_filter_that_matches_nothing_says_so(api: ApiEmulator,
                                                            tmp_path: Path) -> None:
    api.seed(*(gpu_node(f"gpu-{i}", verdict="PASS") for i in range(3)))
    run = await healthd(api, tmp_path, "status", "--verdict", "EVICT")
    assert run.code == 0, run.err
    assert run.out.startswith("no GPU node is EVICT (3 GPU nodes)\n"), run.out
    assert "0 GPU nodes: none" not in run.out
