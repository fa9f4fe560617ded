"""`EventRecorder` against the emulator: the stored Event names the right object,
source and reason, lands in the right namespace, keeps messages within bounds, and
a server that refuses or is gone never turns into an error for the caller."""

from __future__ import annotations

import logging

import pytest

from healthd.kube.client import Kube
from healthd.kube.events import MAX_MESSAGE, EventRecorder
from healthd.kube.objects import EVENTS, NODES, PODS
from healthd.sim.apiserver import ApiEmulator
from tests.kube.conftest import node, pod

pytestmark = pytest.mark.anyio


async def test_an_event_on_a_node_names_it_and_its_source(api: ApiEmulator, kube: Kube) -> None:
    api.seed(node("gpu-1"))
    stored_node = await kube.get(NODES, "gpu-1")
    recorder = EventRecorder(kube, component="healthd-agent", host="gpu-1")
    await recorder.record(stored_node, type="Warning", reason="XID_79",
                          message="GPU 3 fell off the bus")
    [event] = api.list("Event", "default")
    assert event["involvedObject"] == {
        "kind": "Node", "apiVersion": "v1", "name": "gpu-1",
        "uid": stored_node["metadata"]["uid"],
        "resourceVersion": stored_node["metadata"]["resourceVersion"]}
    assert (event["type"], event["reason"]) == ("Warning", "XID_79")
    assert event["message"] == "GPU 3 fell off the bus"
    assert event["source"] == {"component": "healthd-agent", "host": "gpu-1"}
    assert event["reportingComponent"] == "healthd-agent"
    assert event["metadata"]["name"].startswith("gpu-1.")
    assert event["firstTimestamp"] == event["lastTimestamp"]


async def test_an_event_on_a_listed_pod_goes_to_its_namespace(api: ApiEmulator,
                                                              kube: Kube) -> None:
    api.seed(pod("job-0", "team-a"))
    [listed] = (await kube.list(PODS, "team-a"))["items"]
    await EventRecorder(kube, component="healthd-controller").record(
        listed, type="Normal", reason="Reset", message="reset", res=PODS)
    [event] = api.list("Event", "team-a")
    assert event["involvedObject"]["kind"] == "Pod"
    assert event["involvedObject"]["namespace"] == "team-a"
    assert event["source"] == {"component": "healthd-controller"}


async def test_a_long_message_is_trimmed(api: ApiEmulator, kube: Kube) -> None:
    await EventRecorder(kube, component="c").record(
        node("n1"), type="Warning", reason="R", message="x" * 5000)
    [event] = api.list("Event", "default")
    assert len(event["message"]) == MAX_MESSAGE
    assert event["message"].endswith("...")


async def test_a_refused_event_is_logged_not_raised(api: ApiEmulator, kube: Kube,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    api.fail("POST", "/api/v1/namespaces/default/events", 403)
    with caplog.at_level(logging.WARNING, logger="healthd.kube.events"):
        await EventRecorder(kube, component="c").record(
            node("n1"), type="Warning", reason="XID_79", message="m")
    assert api.list("Event", "default") == []
    assert "XID_79" in caplog.text


async def test_a_server_that_is_gone_does_not_break_the_caller(api: ApiEmulator,
                                                               kube: Kube) -> None:
    await api.go_away()
    await EventRecorder(kube, component="c").record(node("n1"), type="Normal", reason="R",
                                                    message="m")
    await api.come_back()
    assert api.list("Event", "default") == []


async def describe_events(kube: Kube, kind: str, name: str, uid: str,
                          namespace: str = "") -> list[str]:
    """The reasons `kubectl describe` lists: it selects Events by the object's kind,
    name, namespace and uid."""
    selector = (f"involvedObject.kind={kind},involvedObject.name={name},"
                f"involvedObject.namespace={namespace},involvedObject.uid={uid}")
    listing = await kube.list(EVENTS, None, field_selector=selector)
    return [e["reason"] for e in listing["items"]]


async def test_an_event_given_only_a_name_carries_the_uid_describe_needs(
        api: ApiEmulator, kube: Kube) -> None:
    api.seed(node("gpu-1"))
    uid = (await kube.get(NODES, "gpu-1"))["metadata"]["uid"]
    recorder = EventRecorder(kube, component="healthd-agent", host="gpu-1")
    await recorder.record({"metadata": {"name": "gpu-1"}}, type="Warning",
                          reason="DiagnosticFailed", message="not scheduled", res=NODES)
    await recorder.record({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-1"}},
                          type="Normal", reason="RequestDone", message="done")
    assert sorted(await describe_events(kube, "Node", "gpu-1", uid)) == [
        "DiagnosticFailed", "RequestDone"]
    for event in api.list("Event", "default"):
        assert {k: event["involvedObject"][k] for k in ("kind", "apiVersion", "uid")} == {
            "kind": "Node", "apiVersion": "v1", "uid": uid}


async def test_an_event_on_an_object_that_cannot_be_read_is_still_posted(
        api: ApiEmulator, kube: Kube) -> None:
    await EventRecorder(kube, component="c").record(
        {"metadata": {"name": "gone"}}, type="Warning", reason="R", message="m", res=NODES)
    [event] = api.list("Event", "default")
    assert event["involvedObject"] == {"kind": "Node", "apiVersion": "v1", "name": "gone"}
