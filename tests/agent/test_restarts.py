"""A restarted agent changes nothing on its Node: the published state is its memory.

For each code family that can hold a node (an XID that NVML delivered once, an XID
and an SXID read once from the kernel log, a failed fabric registration, a failed
DCGM diagnostic, a row-remap failure NVML no longer reports, an RDMA port, a hardware
slowdown), the agent is run until the node is held, then replaced twice by a fresh
process that may no longer see the evidence. Across each restart: the label and the
condition stay as they were, no Event is sent, and the agent writes nothing. Then the
edges: what the Node shows cannot be read, a fresh node is judged before it is shown,
a resumed hold still ends only the way the rules say, and a clear the agent took
before it stopped is carried out and answered by the next one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest

from healthd.sim.apiserver import ApiEmulator
from healthd.sim.machine import MachineSpec, load_machine_spec
from tests.agent.harness import (
    KEYS,
    NODE,
    ROUND_S,
    Harness,
    annotate,
    eventually,
    fast_config,
    node_object,
    running_agent,
    with_intervals,
)
from tests.agent.test_process import HEALTHD, clean_env

pytestmark = pytest.mark.anyio

RESTARTS = 2
ROUNDS_AFTER_START = 4  # completed rounds a restarted agent is watched for

# GPU 5 of a simulated 8-GPU machine sits on bus 0x68.
XID79_LINE = ("NVRM: Xid (PCI:0000:68:00): 79, pid='<unknown>', name=<unknown>, "
              "GPU has fallen off the bus.")
SXID_LINE = ("nvidia-nvswitch2: SXid (PCI:0000:8a:00.0): 12020, Fatal, "
             "Link 46 egress sequence ID error")


def _spec(**fields: Any) -> MachineSpec:
    base = load_machine_spec("healthy-8xh100").model_dump(exclude_unset=True)
    return MachineSpec.model_validate({**base, **fields})


HGX = {"fabric": {"state": "completed"}}


@dataclass(frozen=True)
class Family:
    """A code family: the machine that raises it, the machine after the restart (its
    evidence gone, or still there for damped signals), the label, and the config."""

    name: str
    faulty: MachineSpec
    after: MachineSpec
    label: str
    code: str
    intervals: dict[str, float] = field(default_factory=dict)
    live_xid: bool = False  # NVML delivers XID 79 on GPU 5 while the agent listens


FAMILIES = [
    Family("xid-nvml", _spec(), _spec(), "EVICT", "XID_79", live_xid=True),
    Family("xid-kernel-log", _spec(kernel_log=[XID79_LINE]), _spec(kernel_log=[]),
           "EVICT", "XID_79"),
    Family("sxid-kernel-log", _spec(**HGX, kernel_log=[SXID_LINE]), _spec(**HGX, kernel_log=[]),
           "EVICT", "SXID_12020", {"sxid": ROUND_S}),
    Family("fabric", _spec(**HGX, faults=[{"gpu": 3, "fabric": {
        "state": "completed", "status": "INSUFFICIENT_RESOURCES"}}]),
           _spec(**HGX, faults=[{"gpu": 3, "fabric": {
               "state": "completed", "status": "INSUFFICIENT_RESOURCES"}}]),
           "ERR", "FABRIC_REGISTRATION_FAILED", {"fabric": ROUND_S}),
    Family("dcgm", _spec(dcgm={"output": "v4-fail-pcie"}), _spec(), "EVICT", "DCGM_PCIE",
           {"dcgm": 1.0}),
    Family("remap-failure", load_machine_spec("remap-failure"),
           load_machine_spec("remap-failure").model_copy(update={"faults": []}), "EVICT",
           "REMAP_FAILURE"),
    Family("rdma", _spec(rdma={"devices": 8, "ports": [
        {"device": "mlx5_4", "state": "DOWN", "phys_state": "Disabled"}]}),
           _spec(rdma={"devices": 8, "ports": [
               {"device": "mlx5_4", "state": "DOWN", "phys_state": "Disabled"}]}),
           "ERR", "RDMA_PORT_DOWN", {"rdma": ROUND_S}),
    Family("hw-slowdown", load_machine_spec("hw-slowdown"), load_machine_spec("hw-slowdown"),
           "WARN", "HW_SLOWDOWN"),
]


@dataclass(frozen=True)
class Shown:
    """What the Node shows of the agent's judgement."""

    label: str | None
    condition: tuple[Any, ...]
    held: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, h: Harness) -> Shown:
        cond = h.condition() or {}
        doc = json.loads(h.annotations().get(KEYS.health) or "{}")
        held = tuple(sorted((item["code"], item["entity"]) for item in doc.get("held", [])))
        return cls(h.verdict(), (cond.get("status"), cond.get("reason"),
                                 cond.get("lastTransitionTime")), held)


def _writes(api: ApiEmulator) -> list[Any]:
    """The writes to the Node and its status, oldest first."""
    return api.writes(None, rf"/api/v1/nodes/{NODE}(/status)?")


async def _held(h: Harness, family: Family) -> None:
    """Wait until the family's fault holds the node; a live XID fires every second
    until it does (one fired before the agent listened reaches no one, as on a real
    node)."""
    for tick in range(200):
        if family.live_xid and tick % 10 == 0:
            h.sim.nvml.emit_xid(5, 79)
        if h.verdict() == family.label:
            return
        await anyio.sleep(0.1)
    raise AssertionError(f"{family.label} label not reached")


async def _rounds(h: Harness, rounds: int) -> None:
    """Wait until the xid check (in every round) has completed `rounds` more runs."""
    def runs() -> float:
        return sum(h.metric("healthd_check_runs_total", node=h.agent.node, check="xid",
                            result=r) or 0 for r in ("PASS", "WARN", "ERR", "EVICT"))
    target = runs() + rounds
    await eventually(lambda: runs() >= target, 30, f"{rounds} more rounds")


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
async def test_restarts_change_nothing_on_a_held_node(
        api: ApiEmulator, tmp_path: Path, family: Family) -> None:
    config = with_intervals(fast_config(), **family.intervals)
    async with running_agent(api, tmp_path, spec=family.faulty, config=config) as h:
        await _held(h, family)
        await _rounds(h, 2)
        before = Shown.of(h)
        assert (family.code in {code for code, _ in before.held}), before
        events = len(h.events())
    for restart in range(1, RESTARTS + 1):
        api.clear_log()
        async with running_agent(api, tmp_path, spec=family.after, config=config,
                                 seed=False) as h:
            await _rounds(h, ROUNDS_AFTER_START)
            assert Shown.of(h) == before, f"restart {restart} changed the node"
            writes = [w.body for w in _writes(api)]
            assert writes == [], f"restart {restart} wrote to the node: {writes}"
            assert len(h.events()) == events, f"restart {restart} sent an Event"


async def test_a_restart_on_a_healthy_node_writes_nothing(api: ApiEmulator,
                                                          tmp_path: Path) -> None:
    async with running_agent(api, tmp_path) as h:
        await eventually(lambda: h.verdict() == "PASS", what="PASS label")
        assert await h.parts.publisher.flush(10)  # the condition is its own write
        before = Shown.of(h)
    api.clear_log()
    async with running_agent(api, tmp_path, seed=False) as h:
        await _rounds(h, ROUNDS_AFTER_START)
        assert Shown.of(h) == before
        assert _writes(api) == []


async def test_a_fresh_node_is_shown_only_once_judged(api: ApiEmulator, tmp_path: Path) -> None:
    """The first write carries a judged verdict: never the condition Unknown of a
    round still in progress, and never a verdict from part of the round (the slow
    remapped check ends its first turn last)."""
    config = with_intervals(fast_config(), remapped=3.0)
    async with running_agent(api, tmp_path, spec="remap-pending", config=config) as h:
        await eventually(lambda: h.verdict() == "ERR", what="ERR label")
        assert await h.parts.publisher.flush(10)
        status_writes = [w for w in _writes(api) if w.path.endswith("/status")]
        first = status_writes[0].body["status"]["conditions"][0]
        assert (first["status"], first["reason"]) == ("True", "REMAP_PENDING")
        labels = [w.body["metadata"]["labels"][KEYS.gpuhealth] for w in h.node_writes()
                  if KEYS.gpuhealth in ((w.body.get("metadata") or {}).get("labels") or {})]
        assert labels == ["ERR"]


def _evict_label_with(annotation: str | None) -> dict[str, Any]:
    node = node_object()
    node["metadata"]["labels"][KEYS.gpuhealth] = "EVICT"
    if annotation is not None:
        node["metadata"]["annotations"] = {KEYS.health: annotation}
    return node


@pytest.mark.parametrize("annotation", [None, "{not json", "[1, 2]", json.dumps(
    {"verdict": "PASS", "since": "2026-01-01T00:00:00Z", "held": [], "checks": {}})],
    ids=["none", "garbage", "not-an-object", "says-less"])
async def test_an_evict_label_nothing_explains_stays_evict_until_cleared(
        api: ApiEmulator, tmp_path: Path, annotation: str | None) -> None:
    api.seed(_evict_label_with(annotation))
    async with running_agent(api, tmp_path, seed=False) as h:
        await _rounds(h, ROUNDS_AFTER_START)
        assert h.verdict() == "EVICT"
        assert Shown.of(h).held == (("VERDICT_RESUMED", "node"),)
        h.annotate(**{KEYS.clear: "true"})
        await eventually(lambda: h.verdict() == "PASS", what="PASS after the clear")


async def test_a_resumed_sticky_holding_is_released_only_by_a_clear(
        api: ApiEmulator, tmp_path: Path) -> None:
    async with running_agent(api, tmp_path, spec=FAMILIES[0].faulty) as h:
        await _held(h, FAMILIES[0])
    async with running_agent(api, tmp_path, seed=False) as h:
        await _rounds(h, ROUNDS_AFTER_START)
        assert h.verdict() == "EVICT"
        h.annotate(**{KEYS.clear: "true"})
        await eventually(lambda: h.verdict() == "PASS", what="PASS after the clear")
        reasons = [e["reason"] for e in h.events()]
        assert reasons.count("XID_79") == 1  # raised once, before the restart


async def test_a_resumed_damped_holding_is_released_by_clean_runs(
        api: ApiEmulator, tmp_path: Path) -> None:
    config = with_intervals(fast_config(min_hold=3), rdma=ROUND_S)
    family = next(f for f in FAMILIES if f.name == "rdma")
    async with running_agent(api, tmp_path, spec=family.faulty, config=config) as h:
        await eventually(lambda: h.verdict() == "ERR", what="ERR label")
    async with running_agent(api, tmp_path, spec=_spec(rdma={"devices": 8}), config=config,
                             seed=False) as h:
        await eventually(lambda: h.verdict() == "PASS", 20, "PASS once the port stays up")
        assert await h.parts.publisher.flush(10)  # the Event follows the label's write
        # (Events carry whole seconds: the ones of one second have no order to check.)
        assert "GPU health ERR -> PASS" in [e["message"].split(":")[0] for e in h.events()]


async def test_a_clear_interrupted_by_a_restart_is_carried_out_and_answered_once(
        api: ApiEmulator, tmp_path: Path) -> None:
    """The clear re-runs a slow diagnostic; the agent is replaced while it runs. The
    next agent carries the clear out and answers it under the id written with it."""
    family = next(f for f in FAMILIES if f.name == "dcgm")
    config = with_intervals(fast_config(), **family.intervals)
    async with running_agent(api, tmp_path, spec=family.faulty, config=config) as h:
        await _held(h, family)
    slow = _spec(dcgm={"sleep_s": 60})  # the clear's re-run outlives this agent
    async with running_agent(api, tmp_path, spec=slow, config=config, seed=False,
                             wait_ready=False) as h:  # not ready: its first dcgm run is slow
        h.annotate(**{KEYS.clear: "true", KEYS.run_id: "clear-7"})
        await eventually(lambda: KEYS.clear not in h.annotations(), 10, "the clear taken")
        await eventually(lambda: '"clear_requested":true' in h.annotations()[KEYS.health],
                         10, "the clear under way")
    in_flight = json.loads(api.get("Node", NODE)["metadata"]["annotations"][KEYS.clearing])
    assert (in_flight["id"], in_flight["request"]) == ("clear-7", "true")
    async with running_agent(api, tmp_path, spec=family.after, config=config,
                             seed=False) as h:
        answer = await eventually(lambda: h.last_run(), 20, "the clear answered")
        assert (answer["id"], answer["kind"], answer["accepted"]) == ("clear-7", "clear", True)
        assert answer["start"] == in_flight["start"]
        assert answer["checks"] == {"dcgm": "PASS"} and answer["verdict"] == "PASS"
        assert KEYS.clearing not in h.annotations()
        await eventually(lambda: h.verdict() == "PASS", 10, "PASS once judged")
        cleared = await eventually(lambda: h.events("HealthCleared"), 10, "HealthCleared")
        assert len(cleared) == 1 and "(clear-7)" in cleared[0]["message"]
        await _rounds(h, ROUNDS_AFTER_START)
        assert len(h.events("HealthCleared")) == 1


async def test_a_clear_taken_by_an_agent_killed_at_once_is_carried_out_and_answered(
        api: ApiEmulator, tmp_path: Path) -> None:
    """SIGKILL (an OOM kill) as soon as the clear is taken: the take wrote the clear in
    flight, and the next agent answers it."""
    family = next(f for f in FAMILIES if f.name == "dcgm")
    config = with_intervals(fast_config(), **family.intervals)
    async with running_agent(api, tmp_path, spec=family.faulty, config=config) as h:
        await _held(h, family)
    (tmp_path / "slow.json").write_text(_spec(dcgm={"sleep_s": 60}).model_dump_json())
    (tmp_path / "healthd.json").write_text(config.model_dump_json(exclude_unset=True))
    argv = [*HEALTHD, "agent", "--sim", str(tmp_path / "slow.json"), "--node", NODE,
            "--kubeconfig", str(api.write_kubeconfig(tmp_path / "kubeconfig")),
            "--http-port", "0", "--config", str(tmp_path / "healthd.json")]
    annotate(api, **{KEYS.clear: "true", KEYS.run_id: "clear-9"})
    async with await anyio.open_process(argv, env=clean_env(tmp_path)) as proc:
        try:
            await eventually(lambda: KEYS.clearing in api.get("Node", NODE)["metadata"][
                "annotations"], 30, "the clear taken")
        finally:
            proc.kill()
    async with running_agent(api, tmp_path, spec=family.after, config=config,
                             seed=False) as h:
        answer = await eventually(lambda: h.last_run(), 20, "the clear answered")
        assert (answer["id"], answer["accepted"], answer["checks"]) == (
            "clear-9", True, {"dcgm": "PASS"})
        await eventually(lambda: h.verdict() == "PASS", 10, "PASS once judged")
        assert len(await eventually(lambda: h.events("HealthCleared"), 10, "Event")) == 1


async def test_a_clear_answers_under_the_run_id_written_with_it(
        api: ApiEmulator, tmp_path: Path) -> None:
    async with running_agent(api, tmp_path, spec=FAMILIES[1].faulty) as h:
        await _held(h, FAMILIES[1])
        h.annotate(**{KEYS.clear: "true", KEYS.run_id: "clear-by-tool"})
        answer = await eventually(lambda: h.last_run(), 10, "the clear answered")
        assert (answer["id"], answer["kind"], answer["accepted"]) == (
            "clear-by-tool", "clear", True)
        assert KEYS.run_id not in h.annotations()
        await eventually(lambda: h.events("HealthCleared"), 10, "HealthCleared")
