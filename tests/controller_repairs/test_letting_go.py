"""A GPU reset on a node whose GPUs are held, as on a real node: the agent's NVML
session, persistence mode and the GPU Operator's operands (the simulated nvidia-smi
refuses while any holds). The repair lets go of each first and puts everything back;
what healthd cannot make let go (a host daemon) refuses the reset, which is paced, not
spent from the budget, and ends with the node held, the daemon named."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from healthd.sim.apiserver import ApiEmulator
from healthd.sim.machine import MachineSpec, load_machine_spec
from healthd.sim.node import simulate
from healthd.sim.operands import NAMESPACE, OPERANDS
from tests.agent.harness import eventually
from tests.controller.conftest import KubeFactory, controllers
from tests.controller_repairs.conftest import Cluster, cluster, controller_config

pytestmark = pytest.mark.anyio
REPAIR_S = 90.0
RELEASED = "healthd.io/nvml-released"


def operand_values(c: Cluster) -> set[str]:
    labels = c.node()["metadata"].get("labels") or {}
    return {labels.get(label, "<absent>") for label in OPERANDS.values()}


def operand_pods(c: Cluster) -> list[str]:
    return sorted(p["metadata"]["name"] for p in c.api.list("Pod", NAMESPACE))


def persistence(c: Cluster) -> list[bool]:
    """Each GPU's persistence mode, as another process on the node's machine sees it."""
    spec = c.agent.sim.spec
    with simulate(spec, c.control) as node:
        return [node.nvml.persistence(g) for g in range(spec.gpus.count)]


def resets(c: Cluster) -> list[int]:
    """The GPUs reset on the node's machine, in order (its control file's lines)."""
    lines = [json.loads(line) for line in c.control.read_text().splitlines() if line]
    return [int(line["gpu"]) for line in lines if line.get("op") == "gpu_reset"]


async def sampled(c: Cluster, what: Callable[[], object], until: Callable[[], bool],
                  within: float) -> list[object]:
    """Each value `what()` takes, once per change, until `until()` holds."""
    seen: list[object] = []
    with anyio.fail_after(within):
        while True:
            value = what()
            if not seen or seen[-1] != value:
                seen.append(value)
            if until():
                return seen
            await anyio.sleep(0.02)


def with_daemon(name: str) -> MachineSpec:
    """remap-pending, with a host daemon outside Kubernetes holding every GPU."""
    raw = load_machine_spec("remap-pending").model_dump()
    raw["holders"] = [{"name": name, "gpus": "all"}]
    return MachineSpec.model_validate(raw)


async def test_a_reset_lets_go_of_the_agent_persistence_mode_and_the_operands_first(
        api: ApiEmulator, kube_for: KubeFactory, tmp_path: Path) -> None:
    async with cluster(api, kube_for, tmp_path, operands=True) as c:
        await eventually(lambda: len(operand_pods(c)) == 4, 10, "the operands run")
        persisted = persistence(c)
        assert all(persisted)  # on by default, as nvidia-persistenced leaves a node
        await eventually(lambda: c.agent.verdict() == "ERR", 10, "REMAP_PENDING raised")

        def state() -> object:
            node = c.node()["metadata"]
            return (c.state(), tuple(sorted(operand_values(c))), len(operand_pods(c)),
                    RELEASED in (node.get("annotations") or {}))

        seen = await sampled(c, state, lambda: c.agent.verdict() == "PASS" and c.state() == "",
                             REPAIR_S)

        # While resetting, the operands were paused and gone, and the agent let go.
        assert ("resetting", ("false",), 0, True) in seen, seen
        doc = c.repair()
        assert doc is not None
        uuid = c.agent.sim.spec.uuid(3)
        assert [(a["remedy"], a["gpus"], a["outcome"]) for a in doc["attempts"]] == [
            ("reset", [uuid], "passed")]
        assert "operands" not in doc
        # Everything put back: the operand labels as found, their pods, persistence mode;
        # the agent on NVML again (its validation measured the GPU) and says so.
        assert operand_values(c) == {"true"}
        await eventually(lambda: len(operand_pods(c)) == 4, 10, "the operands back")
        assert persistence(c) == persisted
        assert RELEASED not in (c.node()["metadata"].get("annotations") or {})
        last = c.agent.last_run()
        assert last is not None and last["checks"].get("remapped") == "PASS"
        assert not c.events("GPUResetRefused") and not c.events("RepairFailed")
        # One reset of the one GPU, by one Job.
        assert len(c.kubelet.jobs_seen) == 1
        assert resets(c) == [3]


async def test_a_host_daemon_holding_the_gpus_is_refused_paced_and_the_node_held_naming_it(
        api: ApiEmulator, kube_for: KubeFactory, tmp_path: Path) -> None:
    config = controller_config(attempt_pause="1s", max_refusals=3)
    async with cluster(api, kube_for, tmp_path, spec=with_daemon("nv-hostengine"),
                       operands=True, config=config) as c:
        await eventually(lambda: c.state() == "held", REPAIR_S, "held after the refusals")
        doc = c.repair()
        assert doc is not None
        assert "refused 3 time(s) in a row" in doc["reason"] and "nv-hostengine" in doc["reason"]
        attempts = doc["attempts"]
        assert [(a["remedy"], a["outcome"]) for a in attempts] == [("reset", "refused")] * 3
        # Paced: each attempt started at least the pause after the last ended, and the
        # pause doubled (the record's times are whole seconds).
        gaps = [seconds(b["at"]) - seconds(a["ended"]) for a, b in itertools.pairwise(attempts)]
        assert gaps[0] >= 0 and gaps[1] >= 1, gaps
        # Not spent from the budget (2 resets): no reboot asked for, never hardware.
        assert not c.events("RebootNeeded") and c.requests_created() == 0
        await eventually(lambda: len(c.events("GPUResetRefused")) == 3, 5, "the Events")
        assert resets(c) == []
        assert c.metric("healthd_controller_repairs_total", action="reset",
                        outcome="refused") == 3
        # Whatever held the GPUs before is back: operands, persistence mode.
        assert operand_values(c) == {"true"}
        assert all(persistence(c))
        assert c.agent.verdict() == "ERR"  # still held, and out of service


async def test_a_leader_killed_with_the_operands_paused_leaves_them_restored(
        api: ApiEmulator, kube_for: KubeFactory, tmp_path: Path) -> None:
    async with cluster(api, kube_for, tmp_path, operands=True) as c:
        c.kubelet.run_delay_s = 2.0  # the reset takes a while
        await eventually(lambda: c.state() == "resetting" and operand_values(c) == {"false"},
                         30, "the operands paused")
        c.replica.stop()

        async with controllers(kube_for, controller_config(), "ctl2"):
            await eventually(lambda: c.agent.verdict() == "PASS" and c.state() == "",
                             REPAIR_S, "repaired under the next leader")
        assert operand_values(c) == {"true"}
        await eventually(lambda: len(operand_pods(c)) == 4, 10, "the operands back")
        assert len(c.kubelet.jobs_seen) == 1
        assert resets(c) == [3]


def seconds(stamp: str) -> float:
    from healthd.util.times import parse_time

    at = parse_time(stamp)
    assert at is not None, stamp
    return at
