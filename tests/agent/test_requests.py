"""On-demand requests end to end: every request shape is taken exactly once and
answered in last-run; bad ones get a clear error and a Warning Event and change
nothing else; two quick requests in a row are both answered."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from checks.base import Peer
from healthd.blame.peersets import PeerSet
from healthd.sim.apiserver import ApiEmulator
from tests.agent.harness import KEYS, NODE, Harness, eventually, running_agent

pytestmark = pytest.mark.anyio


async def answered(h: Harness, run_id: str) -> dict:
    def done() -> dict | None:
        answer = h.last_run()
        return answer if answer and answer["id"] == run_id else None

    return await eventually(done, 10, f"answer to {run_id}")


GOOD = [
    ("remapped,power", {"remapped": "PASS", "power": "PASS"}),
    ("all", None),  # every enabled and disabled default check; statuses vary
    ("xid", {"xid": "PASS"}),
]


@pytest.mark.parametrize(("text", "checks"), GOOD)
async def test_good_requests_run_and_are_answered(api: ApiEmulator, tmp_path: Path,
                                                  text: str, checks: dict | None) -> None:
    async with running_agent(api, tmp_path) as h:
        h.request(text, run_id="req-1")
        answer = await answered(h, "req-1")
        assert (answer["request"], answer["accepted"], answer["error"]) == (text, True, "")
        assert answer["verdict"] == "PASS"
        if checks is not None:
            assert answer["checks"] == checks
        else:
            assert {"gpus", "remapped", "pciebw", "ping", "pvc", "dcgm"} <= set(answer["checks"])
        assert KEYS.run not in h.annotations() and KEYS.run_id not in h.annotations()
        await eventually(lambda: h.events("HealthRequestDone"), what="Normal Event")


BAD = [
    ("foo", "unknown check foo"),
    ("remapped,", "empty check name"),
    ("all,remapped", "cannot be combined"),
    ("dcgm:9", "dcgm:9"),
    ("power:2", "takes no argument"),
    ("rem apped", "malformed"),
]


async def test_bad_requests_get_an_error_and_a_warning_and_change_nothing_else(
        api: ApiEmulator, tmp_path: Path) -> None:
    async with running_agent(api, tmp_path) as h:
        await h.judged()
        labels, health = h.labels(), h.annotations()[KEYS.health]
        for number, (text, error) in enumerate(BAD):
            run_id = f"bad-{number}"
            h.request(text, run_id=run_id)
            answer = await answered(h, run_id)
            assert answer["accepted"] is False and error in answer["error"], answer
            assert answer["checks"] == {}
            warnings = await eventually(
                lambda rid=run_id: [e for e in h.events("BadHealthRequest")
                                    if rid in e["message"]], what="Warning Event")
            assert warnings[0]["type"] == "Warning"
        assert h.labels() == labels
        assert h.annotations()[KEYS.health] == health
        assert KEYS.run not in h.annotations()


async def test_a_clear_that_is_not_true_is_refused(api: ApiEmulator, tmp_path: Path) -> None:
    async with running_agent(api, tmp_path) as h:
        h.annotate(**{KEYS.clear: "yes please"})
        answer = await eventually(h.last_run, what="answer")
        assert answer["accepted"] is False and "must be true" in answer["error"]
        assert KEYS.clear not in h.annotations()


async def test_two_quick_requests_are_both_answered(api: ApiEmulator, tmp_path: Path) -> None:
    async with running_agent(api, tmp_path) as h:
        h.request("remapped", run_id="first")
        await eventually(lambda: KEYS.run not in h.annotations(), what="first taken")
        h.request("power", run_id="second")
        second = await answered(h, "second")
        assert second["checks"] == {"power": "PASS"}
        done = await eventually(lambda: len(h.events("HealthRequestDone")) >= 2,
                                what="both answered")
        assert done
        messages = " ".join(e["message"] for e in h.events("HealthRequestDone"))
        assert "(first)" in messages and "(second)" in messages


async def test_a_request_replaced_before_it_was_taken_runs_the_newer_one_once(
        api: ApiEmulator, tmp_path: Path) -> None:
    async with running_agent(api, tmp_path) as h:
        await api.go_away()  # the agent cannot take anything meanwhile
        h.request("remapped", run_id="old")
        h.request("gpus", run_id="new")
        await anyio.sleep(0.3)
        await api.come_back()
        answer = await answered(h, "new")
        assert answer["checks"] == {"gpus": "PASS"}
        await anyio.sleep(0.5)
        done = [e["message"] for e in h.events("HealthRequestDone")]
        assert len(done) == 1 and "(new)" in done[0]


async def test_ping_gets_its_peers_from_its_own_node(api: ApiEmulator, tmp_path: Path) -> None:
    """The peers are what the controller publishes on this agent's Node: none yet,
    ping says SKIPPED (it probed nobody, and says so); once published, it probes
    them. The agent never lists or watches the other agents' pods: its only look at
    pods in their namespace is its own node's (`spec.nodeName`)."""
    async with running_agent(api, tmp_path) as h:
        h.request("ping", run_id="lonely")
        assert (await answered(h, "lonely"))["checks"] == {"ping": "SKIPPED"}  # no peers
        peers = PeerSet(7, (Peer("gpu-node-2", ("127.0.0.1",)),))
        stored = api.get("Node", NODE)
        assert stored is not None
        stored["metadata"].setdefault("annotations", {})[KEYS.peers] = peers.encode()
        api.put(stored)
        await eventually(lambda: h.agent.inputs.peers, what="peers read from the Node")
        assert list(h.agent.inputs.peers) == list(peers.peers)
        h.request("ping", run_id="with-peer")
        answer = await answered(h, "with-peer")
        assert answer["checks"]["ping"] != "SKIPPED"  # it probed gpu-node-2
    looks = api.requests_to("GET", "/api/v1/namespaces/healthd-system/pods")
    assert looks and all(r.query.get("fieldSelector") == f"spec.nodeName={NODE}"
                         and r.query.get("watch") != "true" for r in looks)
    assert all("spec.nodeName" in (r.query.get("fieldSelector") or "")
               for r in api.requests_to("GET", "/api/v1/pods"))
