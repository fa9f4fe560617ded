"""The node publisher against the API emulator over HTTP: what it writes on first
publish and on a raise, that a steady state writes nothing, that lastTransitionTime
moves only with the status, that other owners' keys survive every write, that an API
outage ends with exactly the latest state written, and the Events of transitions."""

from __future__ import annotations

import json

import anyio
import pytest

from healthd.agent.verdict import Policy, Trigger, apply, end_testing, initial, start_testing
from healthd.kube.backoff import Backoff
from healthd.kube.conventions import CONDITION_TYPE, Reason, dcgm_label_value
from healthd.kube.objects import NODES
from tests.agent_publish.conftest import (
    KEYS,
    NODE,
    finding,
    judged,
    node_object,
    result,
    running,
)

pytestmark = pytest.mark.anyio

XID79 = "XID 79: GPU has fallen off the bus"


def condition(node: dict) -> dict:
    (ours,) = [c for c in node["status"]["conditions"] if c["type"] == CONDITION_TYPE]
    return ours


def health(node: dict) -> dict:
    return json.loads(node["metadata"]["annotations"][KEYS.health])


def healthy():
    return judged(("remapped", result("remapped")), ("xid", result("xid")))


def remap_pending(message: str = "2 rows pending remapping"):
    return judged(("remapped", result("remapped", finding("REMAP_PENDING", 3, message))))


async def test_first_publish_of_pass_writes_label_annotation_and_false_condition(api) -> None:
    async with running(api) as h:
        await h.published(healthy())
        node = h.node()
        assert node["metadata"]["labels"][KEYS.gpuhealth] == "PASS"
        assert health(node)["verdict"] == "PASS"
        assert set(health(node)["checks"]) == {"remapped", "xid"}
        cond = condition(node)
        assert (cond["status"], cond["reason"]) == ("False", Reason.HEALTHY)
        assert cond["lastTransitionTime"]
        assert h.events() == []  # a fresh node that is healthy: nothing to announce
        h.assert_foreign_untouched()


async def test_steady_state_sends_no_write(api) -> None:
    async with running(api) as h:
        state = healthy()
        await h.published(state)
        h.api.clear_log()
        await h.published(state)
        # A later periodic pass changes nothing a user sees: still no write.
        later = apply(state, "remapped", result("remapped"), trigger=Trigger.PERIODIC,
                      at=state.since + 30, policy=Policy())
        await h.published(later)
        await anyio.sleep(0.1)
        assert h.api.writes() == []


async def test_restarted_publisher_finds_node_current_and_writes_nothing(api) -> None:
    async with running(api) as h:
        await h.published(healthy())
    api.clear_log()
    async with running(api, seed=False) as h:
        later = judged(("remapped", result("remapped")), ("xid", result("xid")), at=5000.0)
        await h.published(later)
        assert api.writes() == []
        assert len(api.requests_to("GET", f"/api/v1/nodes/{NODE}")) == 1


async def test_raise_is_one_metadata_patch_one_status_patch_one_warning_event(api) -> None:
    async with running(api) as h:
        await h.published(healthy())
        h.api.clear_log()
        await h.published(remap_pending())
        assert [w.path for w in h.node_writes()] == [
            f"/api/v1/nodes/{NODE}", f"/api/v1/nodes/{NODE}/status"]
        node = h.node()
        assert node["metadata"]["labels"][KEYS.gpuhealth] == "ERR"
        cond = condition(node)
        assert (cond["status"], cond["reason"]) == ("True", "REMAP_PENDING")
        assert "GPU 3 (GPU-00000003" in cond["message"]
        (event,) = h.events()
        assert (event["type"], event["reason"]) == ("Warning", "REMAP_PENDING")
        assert "PASS -> ERR" in event["message"] and "GPU 3" in event["message"]
        assert event["involvedObject"]["name"] == NODE
        h.assert_foreign_untouched()


async def test_evict_names_the_gpu_and_code_in_condition_and_event(api) -> None:
    async with running(api) as h:
        await h.published(judged(("xid", result("xid", finding("XID_79", 5, XID79)))))
        cond = condition(h.node())
        assert cond["reason"] == "XID_79"
        assert cond["message"].startswith(f"GPU 5 (GPU-00000005-aaaa-bbbb-cccc-dddddddddddd): "
                                          f"{XID79}")
        (event,) = h.events()
        assert (event["type"], event["reason"]) == ("Warning", "XID_79")
        assert h.node()["metadata"]["labels"][KEYS.gpuhealth] == "EVICT"


async def test_a_moving_value_rewrites_nothing_and_the_transition_time_stays(api) -> None:
    async with running(api) as h:
        first = remap_pending("2 rows pending")
        await h.published(first)
        before = condition(h.node())
        h.api.clear_log()
        h.clock.now += 120
        later = apply(first, "remapped",
                      result("remapped", finding("REMAP_PENDING", 3, "5 rows pending")),
                      trigger=Trigger.PERIODIC, at=first.since + 120, policy=Policy())
        await h.published(later)
        assert h.api.writes() == []  # same meaning: the held message is the one raised
        assert condition(h.node())["message"] == before["message"]
        assert "2 rows pending" in before["message"]
        h.clock.now += 120
        await h.published(healthy())
        third = condition(h.node())
        assert third["status"] == "False"
        assert third["lastTransitionTime"] != before["lastTransitionTime"]
        assert len(h.events()) == 2  # the raise and the recovery, nothing between


async def test_recovery_is_a_normal_event_and_foreign_keys_survive(api) -> None:
    async with running(api) as h:
        bad = remap_pending()
        await h.published(bad, dcgm_levels={1: dcgm_label_value(True, 1_750_000_000)})
        h.assert_foreign_untouched()
        policy = Policy(recover_after=2, min_hold=0)  # released on its second clean run
        good = bad
        for at in (2000.0, 2030.0):
            good = apply(good, "remapped", result("remapped"), trigger=Trigger.PERIODIC, at=at,
                         policy=policy)
        await h.published(good, dcgm_levels={1: None})  # and remove the dcgm label
        node = h.node()
        assert node["metadata"]["labels"][KEYS.gpuhealth] == "PASS"
        assert KEYS.dcgm_level(1) not in node["metadata"]["labels"]
        assert [(e["type"], e["reason"]) for e in h.events()] == [
            ("Warning", "REMAP_PENDING"), ("Normal", Reason.HEALTHY)]
        assert "released REMAP_PENDING on GPU 3" in h.events()[1]["message"]
        h.assert_foreign_untouched()


async def test_unjudged_state_leaves_label_alone_and_condition_unknown(api) -> None:
    obj = node_object()
    obj["metadata"]["labels"][KEYS.gpuhealth] = "WARN"  # from an earlier agent
    api.seed(obj)
    async with running(api, seed=False) as h:
        await h.published(initial(1000.0))
        node = h.node()
        assert node["metadata"]["labels"][KEYS.gpuhealth] == "WARN"
        cond = condition(node)
        assert (cond["status"], cond["reason"]) == ("Unknown", Reason.CANNOT_JUDGE)
        assert health(node)["verdict"] == "UNKNOWN"
        assert h.events() == []


async def test_api_outage_then_latest_state_written_once(api) -> None:
    async with running(api) as h:
        await h.published(healthy())
        await api.go_away()
        h.publish(remap_pending())
        evict = judged(("xid", result("xid", finding("XID_79", 5, XID79))))
        h.publish(evict)
        assert not await h.publisher.flush(0.5)  # several failed tries, no crash
        assert not h.publisher.in_sync and h.publisher.last_error
        api.clear_log()
        await api.come_back()
        assert await h.publisher.flush(5), h.publisher.last_error
        assert h.publisher.last_error == ""
        meta_writes = h.api.writes("PATCH", f"/api/v1/nodes/{NODE}")
        assert len(meta_writes) == 1
        assert meta_writes[0].body["metadata"]["labels"] == {KEYS.gpuhealth: "EVICT"}
        assert len(h.api.writes("PATCH", f"/api/v1/nodes/{NODE}/status")) == 1
        assert h.node()["metadata"]["labels"][KEYS.gpuhealth] == "EVICT"
        # Only what the Node showed is announced: PASS -> EVICT, never the ERR that
        # was replaced before it could be written.
        assert [(e["reason"], e["message"].split(":")[0]) for e in h.events()] == [
            ("XID_79", "GPU health PASS -> EVICT")]
        h.assert_foreign_untouched()


async def test_server_errors_are_retried_until_written(api) -> None:
    async with running(api) as h:
        api.fail("PATCH", f"/api/v1/nodes/{NODE}", 500, times=2)
        await h.published(remap_pending())
        assert h.node()["metadata"]["labels"][KEYS.gpuhealth] == "ERR"


class Delays(Backoff):
    """A backoff without jitter that remembers each delay it gave."""

    def __init__(self, initial: float, maximum: float) -> None:
        super().__init__(initial=initial, maximum=maximum, jitter=0)
        self.given: list[float] = []

    def next(self) -> float:
        self.given.append(super().next())
        return self.given[-1]


async def test_a_write_that_goes_through_starts_the_backoff_again(api) -> None:
    delays = Delays(initial=0.05, maximum=0.4)
    async with running(api, backoff=delays) as h:
        api.fail("PATCH", f"/api/v1/nodes/{NODE}", 500, times=3)
        api.fail("PATCH", f"/api/v1/nodes/{NODE}/status", 500, times=1)
        await h.published(remap_pending())
        # Three refused label writes, then the labels went through and the condition
        # was refused once: it waits the first delay again, not a fourth, longer one.
        assert delays.given == [0.05, 0.1, 0.2, 0.05]
        assert condition(h.node())["status"] == "True"


async def test_a_server_that_was_unreachable_is_written_when_the_watch_sees_it_again(
        api) -> None:
    async with running(api, backoff=Backoff(initial=30, maximum=30)) as h:
        await h.published(healthy())
        await api.go_away()
        h.publish(remap_pending())
        assert not await h.publisher.flush(0.3)  # unreachable: 30 s until the next try
        await api.come_back()
        h.publisher.observe(h.node())  # the node's watch reconnected and delivered it
        assert await h.publisher.flush(5), h.publisher.last_error
        assert h.node()["metadata"]["labels"][KEYS.gpuhealth] == "ERR"


async def test_a_refusal_keeps_its_backoff_whatever_the_watch_delivers(api) -> None:
    async with running(api, backoff=Backoff(initial=30, maximum=30)) as h:
        await h.published(healthy())
        api.fail("PATCH", f"/api/v1/nodes/{NODE}", 500, times=1)
        h.publish(remap_pending())
        assert not await h.publisher.flush(0.3)
        h.publisher.observe(h.node())  # the server answers, but it refused: no early try
        assert not await h.publisher.flush(0.5)
        assert h.node()["metadata"]["labels"][KEYS.gpuhealth] == "PASS"


async def test_someone_removing_our_label_gets_it_back(api) -> None:
    async with running(api) as h:
        await h.published(remap_pending())
        answer = await h.kube.merge_patch(
            NODES, NODE, {"metadata": {"labels": {KEYS.gpuhealth: None}}})
        h.api.clear_log()
        h.publisher.observe(answer)  # as the agent's node watch would deliver it
        assert await h.publisher.flush(5)
        assert h.node()["metadata"]["labels"][KEYS.gpuhealth] == "ERR"
        assert len(h.api.writes("PATCH", f"/api/v1/nodes/{NODE}")) == 1


async def test_stale_watch_event_does_not_cause_a_write(api) -> None:
    async with running(api) as h:
        before = h.node()
        await h.published(remap_pending())
        h.api.clear_log()
        h.publisher.observe(before)  # an old version, delivered late
        await anyio.sleep(0.1)
        assert h.api.writes() == []
        assert h.publisher.in_sync


async def test_first_judgement_is_announced_against_what_the_node_showed(api) -> None:
    obj = node_object()
    obj["metadata"]["labels"][KEYS.gpuhealth] = "ERR"  # left by an earlier agent
    api.seed(obj)
    async with running(api, seed=False) as h:
        await h.published(healthy())
        assert h.node()["metadata"]["labels"][KEYS.gpuhealth] == "PASS"
        (event,) = h.events()
        assert (event["type"], event["reason"]) == ("Normal", Reason.HEALTHY)
        assert "ERR -> PASS" in event["message"]


async def test_diagnostic_start_and_end_are_normal_events(api) -> None:
    async with running(api) as h:
        state = healthy()
        await h.published(state)
        testing = start_testing(state, "dcgm:3", at=2000.0)
        await h.published(testing)
        assert h.node()["metadata"]["labels"][KEYS.gpuhealth] == "TESTING"
        assert condition(h.node())["status"] == "False"
        await h.published(end_testing(testing, "dcgm:3", at=2100.0))
        assert [(e["type"], e["reason"]) for e in h.events()] == [
            ("Normal", Reason.TESTING), ("Normal", Reason.HEALTHY)]
        assert "dcgm:3" in h.events()[0]["message"]
        h.assert_foreign_untouched()


CONFLICT = {"kind": "Status", "code": 409, "reason": "Conflict",
            "message": "the object has been modified; please apply your changes to the "
                       "latest version and try again"}


async def test_a_409_is_retried_against_the_fresh_node_without_an_event(api) -> None:
    async with running(api) as h:
        await h.published(healthy())
        api.fail("PATCH", f"/api/v1/nodes/{NODE}", 409, times=2, body=CONFLICT)
        h.api.clear_log()
        await h.published(remap_pending())
        assert h.node()["metadata"]["labels"][KEYS.gpuhealth] == "ERR"
        assert [w.status for w in h.node_writes() if w.path == f"/api/v1/nodes/{NODE}"] == [
            409, 409, 200]
        assert len(api.requests_to("GET", f"/api/v1/nodes/{NODE}")) == 2  # a fresh read each
        assert [e["reason"] for e in h.events()] == ["REMAP_PENDING"]  # the raise, no warning


async def test_409_on_every_retry_is_one_conflict_warning_then_backoff(api) -> None:
    async with running(api) as h:
        await h.published(healthy())
        api.fail("PATCH", f"/api/v1/nodes/{NODE}", 409, times=1000, body=CONFLICT)
        h.publish(remap_pending())
        with anyio.move_on_after(1.0):
            while not any(e["reason"] == Reason.NODE_WRITE_CONFLICT for e in h.events()):
                await anyio.sleep(0.02)
        await anyio.sleep(0.5)  # more backoff rounds: still one Event
        (warning,) = [e for e in h.events() if e["reason"] == Reason.NODE_WRITE_CONFLICT]
        assert warning["type"] == "Warning" and "conflict" in warning["message"]
        api.clear_faults()
        assert await h.publisher.flush(5)
        assert h.node()["metadata"]["labels"][KEYS.gpuhealth] == "ERR"
        assert [e["reason"] for e in h.events()] == [Reason.NODE_WRITE_CONFLICT, "REMAP_PENDING"]
