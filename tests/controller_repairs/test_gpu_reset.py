"""A pending row remap repaired without an admin: the GPU reset in place by a Job on
the node, the node validated by its agent, PASS again; and what holds a repair back."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from healthd.controller import repairs
from healthd.sim.apiserver import ApiEmulator
from tests.agent.harness import KEYS, NODE, eventually
from tests.controller.conftest import KubeFactory
from tests.controller_repairs.conftest import (
    OPT_OUT,
    Cluster,
    Obj,
    cluster,
    controller_config,
    gpu_node,
    gpu_pod,
    labels_until_settled,
)

pytestmark = pytest.mark.anyio
REPAIR_S = 60.0  # a loose bound: two `healthd` subprocesses and a few check rounds


def label(c: Cluster) -> str | None:
    return c.agent.verdict()


async def repaired(c: Cluster) -> None:
    """Until the repair is over and the node shows PASS."""
    await eventually(lambda: label(c) == "PASS" and c.state() == "", REPAIR_S, "PASS again")


async def test_a_pending_remap_on_an_idle_node_is_reset_validated_and_released(
        api: ApiEmulator, kube_for: KubeFactory, tmp_path: Path) -> None:
    async with cluster(api, kube_for, tmp_path) as c:
        await eventually(lambda: label(c) == "ERR", 10, "the agent raises REMAP_PENDING")
        labels = await labels_until_settled(
            c, lambda: label(c) == "PASS" and c.state() == "", REPAIR_S)

        uuid = c.agent.sim.spec.uuid(3)
        doc = c.repair()
        assert doc is not None
        assert [(a["remedy"], a["gpus"], a["outcome"]) for a in doc["attempts"]] == [
            ("reset", [uuid], "passed")]
        assert c.kubelet.jobs_seen == [f"healthd-system-repair/healthd-gpu-reset-{NODE}-1"]
        job = c.jobs()[0]
        container = job["spec"]["template"]["spec"]["containers"][0]
        assert container["command"][:2] == ["healthd", "gpu-reset"] and uuid in container["command"]
        assert container["resources"]["requests"] == {"nvidia.com/gpu": "8"}
        assert labels == ["ERR", "TESTING", "PASS"]
        await eventually(lambda: c.events("RepairSucceeded"), 5, "the Event")
        for reason in ("GPUReset", "RepairValidating", "RepairSucceeded"):
            assert len(c.events(reason)) == 1, reason
        assert not c.events("RepairFailed")
        last = c.agent.last_run()
        assert last is not None and last["id"] == "repair-1" and last["checks"] == {
            "remapped": "PASS"}
        assert c.metric("healthd_controller_repairs_total", action="reset",
                        outcome="passed") == 1
        assert c.metric("healthd_controller_fault_to_pass_seconds_count") == 1

        # Repaired and settled, then quiet: neither the controller nor the agent writes.
        await anyio.sleep(1.0)
        writes = len(api.writes())
        await anyio.sleep(1.5)
        assert [(r.user, r.path, r.body) for r in api.writes()[writes:]
                if "/leases" not in r.path] == []


def foreign_pod() -> Obj:
    """A running pod holding GPUs that no AppWrapper made (a notebook)."""
    pod = gpu_pod("notebook")
    del pod["metadata"]["labels"]["workload.codeflare.dev/appwrapper"]
    return pod


@pytest.mark.parametrize(("pod", "said"), [
    (gpu_pod(), "1 running pod(s) still hold"),
    # The caches hold AppWrapper pods only: this one is found by a read, and looked at
    # again sooner than in production.
    (foreign_pod(), "not from an AppWrapper hold the node's GPUs: team-a/notebook"),
], ids=["appwrapper", "other"])
async def test_a_running_gpu_pod_makes_the_repair_wait_until_it_ends(
        api: ApiEmulator, kube_for: KubeFactory, tmp_path: Path, pod: Obj, said: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(repairs, "OTHER_PODS_S", 0.5)
    async with cluster(api, kube_for, tmp_path, pods=(pod,)) as c:
        await eventually(lambda: c.state() == "waiting", 15, "the repair waits")
        doc = c.repair()
        assert doc is not None and said in doc["reason"]
        await eventually(lambda: c.events("RepairWaiting"), 5, "the Event")
        assert c.jobs() == []

        api.remove("Pod", pod["metadata"]["name"], "team-a")
        await repaired(c)
        assert len(c.kubelet.jobs_seen) == 1


async def test_a_fault_that_survives_resets_is_reset_twice_then_needs_a_reboot(
        api: ApiEmulator, kube_for: KubeFactory, tmp_path: Path) -> None:
    from healthd.sim.machine import load_machine_spec
    from tests.controller_repairs.conftest import hardware

    async with cluster(api, kube_for, tmp_path,
                       spec=hardware(load_machine_spec("remap-pending"))) as c:
        await eventually(lambda: c.state() == "held", 2 * REPAIR_S, "reboot needed")
        doc = c.repair()
        assert doc is not None and doc["reason"].startswith("reboot needed")
        assert [(a["remedy"], a["outcome"]) for a in doc["attempts"]] == [
            ("reset", "failed"), ("reset", "failed")]
        assert len(c.kubelet.jobs_seen) == 2
        await eventually(lambda: c.events("RebootNeeded"), 5, "the Event")
        assert len(c.events("RepairFailed")) == 2
        assert label(c) == "ERR"  # kept out: the finding is still held
        await eventually(lambda: (c.agent.condition() or {}).get("message", "").endswith(
            "; repair: reboot needed"), 10, "the node's condition says so")
        assert c.requests_created() == 0


@pytest.mark.parametrize(("node", "config", "said"), [
    (gpu_node(labels={OPT_OUT: "true"}), controller_config(), OPT_OUT),
    (gpu_node(cordoned=True), controller_config(), "cordoned by someone else"),
])
async def test_a_node_that_is_not_ours_to_repair_is_held_and_says_why(
        api: ApiEmulator, kube_for: KubeFactory, tmp_path: Path, node: dict[str, object],
        config: object, said: str) -> None:
    async with cluster(api, kube_for, tmp_path, node=node) as c:  # type: ignore[arg-type]
        await eventually(lambda: c.state() == "held", 15, "held")
        doc = c.repair()
        assert doc is not None and said in doc["reason"]
        await eventually(lambda: c.events("RepairHeld"), 5, "the Event")
        await anyio.sleep(1.0)
        assert len(c.events("RepairHeld")) == 1
        assert c.jobs() == [] and label(c) == "ERR"
        assert len(c.repair_writes()) == 1  # said once, not again


async def test_dry_run_decides_and_counts_but_writes_nothing(
        api: ApiEmulator, kube_for: KubeFactory, tmp_path: Path) -> None:
    config = controller_config()
    config = config.model_copy(update={"controller": config.controller.model_copy(
        update={"dry_run": True})})
    async with cluster(api, kube_for, tmp_path, config=config) as c:
        await eventually(lambda: c.metric("healthd_controller_repairs_total", action="reset",
                                          outcome="dry-run") == 1, 15, "the decision counted")
        await anyio.sleep(1.0)
        assert c.repair() is None and c.jobs() == [] and c.repair_writes() == []
        assert not c.events("GPUReset")
        assert c.metric("healthd_controller_repairs_total", action="reset",
                        outcome="dry-run") == 1
        assert KEYS.run not in (c.node()["metadata"].get("annotations") or {})
