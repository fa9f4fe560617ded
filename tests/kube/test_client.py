"""`Kube` against the API emulator over real HTTP: the verbs, the three patch kinds on
a Node, selectors, optimistic concurrency, and how every failure (HTTP status,
garbage body, timeout, server gone) reaches callers as a `healthd.kube.errors` type
carrying the server's message. Also `Kube.connect` from kubeconfig sources."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from healthd.kube import errors
from healthd.kube.client import Kube
from healthd.kube.objects import EVENTS, NODES, PODS
from healthd.sim.apiserver import ApiEmulator
from tests.kube.conftest import node, pod

pytestmark = pytest.mark.anyio

NODE_PATH = "/api/v1/nodes/n1"


async def test_get_create_list_and_delete(api: ApiEmulator, kube: Kube) -> None:
    created = await kube.create(PODS, pod("p1", "team-a"))
    assert created["metadata"]["uid"]
    await kube.create(PODS, pod("p2", "team-b"))
    assert (await kube.get(PODS, "p1", "team-a"))["metadata"]["namespace"] == "team-a"
    everywhere = await kube.list(PODS)
    assert sorted(p["metadata"]["name"] for p in everywhere["items"]) == ["p1", "p2"]
    assert everywhere["metadata"]["resourceVersion"]
    assert [p["metadata"]["name"] for p in (await kube.list(PODS, "team-b"))["items"]] == ["p2"]
    await kube.delete(PODS, "p1", "team-a")
    assert api.get("Pod", "p1", "team-a") is None
    assert api.writes("DELETE")[0].body["propagationPolicy"] == "Background"


async def test_deleting_what_is_gone_is_not_an_error(kube: Kube) -> None:
    await kube.delete(PODS, "never-was", "default")


async def test_label_and_field_selectors(api: ApiEmulator, kube: Kube) -> None:
    api.seed(pod("a", labels={"app": "agent"}, node_name="n1"),
             pod("b", labels={"app": "agent"}, node_name="n2"),
             pod("c", labels={"app": "other"}, node_name="n1"))
    by_label = await kube.list(PODS, label_selector="app=agent")
    assert sorted(p["metadata"]["name"] for p in by_label["items"]) == ["a", "b"]
    both = await kube.list(PODS, "default", label_selector="app=agent",
                           field_selector="spec.nodeName=n1")
    assert [p["metadata"]["name"] for p in both["items"]] == ["a"]


async def test_merge_patch_merges_labels_and_null_removes_an_annotation(
        api: ApiEmulator, kube: Kube) -> None:
    api.seed(node("n1", {"team": "x"}, annotations={"keep": "1", "drop": "2"}))
    await kube.merge_patch(NODES, "n1", {"metadata": {
        "labels": {"healthd.io/v": "PASS"}, "annotations": {"drop": None}}})
    stored = api.get("Node", "n1")
    assert stored["metadata"]["labels"] == {"team": "x", "healthd.io/v": "PASS"}
    assert stored["metadata"]["annotations"] == {"keep": "1"}
    assert api.writes("PATCH", NODE_PATH)[0].content_type == "application/merge-patch+json"


async def test_json_patch_applies_when_its_test_holds(api: ApiEmulator, kube: Kube) -> None:
    api.seed(node("n1", annotations={"healthd.io/run": "all"}))
    await kube.json_patch(NODES, "n1", [
        {"op": "test", "path": "/metadata/annotations/healthd.io~1run", "value": "all"},
        {"op": "remove", "path": "/metadata/annotations/healthd.io~1run"}])
    assert api.get("Node", "n1")["metadata"].get("annotations", {}) == {}


async def test_json_patch_whose_test_fails_is_invalid_and_changes_nothing(
        api: ApiEmulator, kube: Kube) -> None:
    api.seed(node("n1", annotations={"healthd.io/run": "dcgm:3"}))
    with pytest.raises(errors.Invalid) as caught:
        await kube.json_patch(NODES, "n1", [
            {"op": "test", "path": "/metadata/annotations/healthd.io~1run", "value": "all"},
            {"op": "remove", "path": "/metadata/annotations/healthd.io~1run"}])
    assert caught.value.status == 422
    assert "test" in caught.value.message
    assert api.get("Node", "n1")["metadata"]["annotations"] == {"healthd.io/run": "dcgm:3"}


async def test_strategic_status_patch_sets_one_condition_and_keeps_the_others(
        api: ApiEmulator, kube: Kube) -> None:
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady"}
    api.seed({**node("n1"), "status": {"conditions": [ready]}})
    mine = {"type": "GPUUnhealthy", "status": "True", "reason": "XID_79"}
    await kube.strategic_patch(NODES, "n1", {"status": {"conditions": [mine]}},
                               subresource="status")
    conditions = {c["type"]: c for c in api.get("Node", "n1")["status"]["conditions"]}
    assert conditions["Ready"]["status"] == "True"
    assert conditions["GPUUnhealthy"]["reason"] == "XID_79"
    assert api.writes("PATCH", NODE_PATH + "/status")


async def test_stale_resource_version_is_a_conflict(api: ApiEmulator, kube: Kube) -> None:
    api.seed(node("n1"))
    old = await kube.get(NODES, "n1")
    await kube.merge_patch(NODES, "n1", {"metadata": {"labels": {"a": "1"}}})
    old["metadata"]["labels"] = {"b": "2"}
    with pytest.raises(errors.Conflict):
        await kube.replace(NODES, "n1", old)
    assert api.get("Node", "n1")["metadata"]["labels"] == {"a": "1"}


async def test_creating_twice_is_a_conflict(kube: Kube) -> None:
    await kube.create(NODES, node("n1"))
    with pytest.raises(errors.Conflict, match="already exists"):
        await kube.create(NODES, node("n1"))


async def test_a_missing_object_is_not_found_with_the_servers_message(kube: Kube) -> None:
    with pytest.raises(errors.NotFound) as caught:
        await kube.get(NODES, "ghost")
    assert caught.value.status == 404
    assert caught.value.reason == "NotFound"
    assert "ghost" in caught.value.message


@pytest.mark.parametrize(("status", "error"), [
    (500, errors.Unavailable), (502, errors.Unavailable), (503, errors.Unavailable),
    (429, errors.Unavailable), (401, errors.Forbidden), (403, errors.Forbidden),
    (404, errors.NotFound), (409, errors.Conflict), (410, errors.Gone),
    (422, errors.Invalid), (400, errors.KubeError), (415, errors.KubeError),
])
async def test_every_status_becomes_its_error(api: ApiEmulator, kube: Kube, status: int,
                                              error: type[errors.KubeError]) -> None:
    api.seed(node("n1"))
    api.fail("GET", NODE_PATH, status)
    with pytest.raises(errors.KubeError) as caught:
        await kube.get(NODES, "n1")
    assert type(caught.value) is error
    assert caught.value.status == status
    assert caught.value.message == f"injected fault: {status}"
    assert (await kube.get(NODES, "n1"))["metadata"]["name"] == "n1"  # one fault only


async def test_rbac_refusal_is_forbidden(api: ApiEmulator) -> None:
    api.seed(node("n1"))
    api.authorizer = lambda user, verb, *rest: verb != "patch"
    async with Kube(api.async_client("agent")) as kube:
        assert (await kube.get(NODES, "n1"))["metadata"]["name"] == "n1"
        with pytest.raises(errors.Forbidden):
            await kube.merge_patch(NODES, "n1", {"metadata": {"labels": {"a": "b"}}})


async def test_a_body_that_is_not_a_status_still_gives_a_message(
        api: ApiEmulator, kube: Kube) -> None:
    api.fail("GET", NODE_PATH, 502, body="<html>bad gateway</html>")
    with pytest.raises(errors.Unavailable, match="bad gateway"):
        await kube.get(NODES, "n1")


async def test_a_success_that_is_not_json_is_unavailable(api: ApiEmulator, kube: Kube) -> None:
    api.fail("GET", NODE_PATH, 200, body="<html>login page</html>")
    with pytest.raises(errors.Unavailable, match="not JSON"):
        await kube.get(NODES, "n1")


async def test_a_slow_server_times_out_as_unavailable(api: ApiEmulator) -> None:
    api.seed(node("n1"))
    api.fail("GET", NODE_PATH, None, delay=5)
    async with Kube(api.async_client(), timeout_s=0.3) as kube:
        started = time.monotonic()
        with pytest.raises(errors.Unavailable) as caught:
            await kube.get(NODES, "n1")
        assert time.monotonic() - started < 3
        assert caught.value.reason == "Timeout"
        # A per-request deadline overrides the default.
        api.fail("GET", NODE_PATH, None, delay=0.5)
        assert (await kube.request("GET", NODE_PATH, timeout_s=3))["metadata"]["name"] == "n1"


async def test_a_server_that_went_away_is_unavailable_until_it_returns(
        api: ApiEmulator, kube: Kube) -> None:
    api.seed(node("n1"))
    await kube.get(NODES, "n1")  # a pooled connection now exists
    await api.go_away()
    with pytest.raises(errors.Unavailable):
        await kube.get(NODES, "n1")
    with pytest.raises(errors.Unavailable):
        await kube.create(EVENTS, {"metadata": {"name": "e", "namespace": "default"}})
    await api.come_back()
    assert (await kube.get(NODES, "n1"))["metadata"]["name"] == "n1"


async def test_connect_from_an_explicit_kubeconfig(api: ApiEmulator, tmp_path: Path) -> None:
    api.seed(node("n1"))
    path = api.write_kubeconfig(tmp_path / "config", user="agent")
    async with await Kube.connect(str(path)) as kube:
        assert (await kube.get(NODES, "n1"))["metadata"]["name"] == "n1"
    assert api.requests[-1].user == "agent"


async def test_connect_from_the_kubeconfig_variable(api: ApiEmulator, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    api.seed(node("n1"))
    monkeypatch.setenv("KUBECONFIG", str(api.write_kubeconfig(tmp_path / "config")))
    async with await Kube.connect() as kube:
        assert (await kube.get(NODES, "n1"))["metadata"]["name"] == "n1"


async def test_connect_without_any_configuration_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(errors.KubeError, match="no usable Kubernetes configuration"):
        await Kube.connect()
    with pytest.raises(errors.KubeError, match="no usable Kubernetes configuration"):
        await Kube.connect(str(tmp_path / "missing"))
