"""What only the emulator can do: the request log, injected faults, going away and
coming back on the same port, the authorizer hook, and direct store access."""

from __future__ import annotations

import aiohttp
import anyio
import pytest

from healthd.sim.apiserver import ApiEmulator
from tests.emulator.kube import Kube

pytestmark = pytest.mark.anyio

NODE = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}


async def test_log_records_exactly_the_writes(emulator: ApiEmulator, ekube: Kube) -> None:
    emulator.seed(NODE)
    emulator.clear_log()
    await ekube.call("CoreV1Api", "read_node", "n1")
    await ekube.call("CoreV1Api", "list_node", label_selector="a=b")
    assert emulator.writes() == []
    await ekube.call("CoreV1Api", "patch_node", "n1", {"metadata": {"labels": {"a": "b"}}})
    [patch] = emulator.writes("PATCH", "/api/v1/nodes/n1")
    assert patch.content_type == "application/strategic-merge-patch+json"
    assert patch.body == {"metadata": {"labels": {"a": "b"}}} and patch.status == 200
    assert patch.user == "admin" and patch.user_agent
    [listing] = emulator.requests_to("GET", "/api/v1/nodes")
    assert listing.query == {"labelSelector": "a=b"}


async def test_fault_fails_the_next_matching_requests(emulator: ApiEmulator,
                                                     ekube: Kube) -> None:
    emulator.seed(NODE)
    emulator.fail("GET", r"/api/v1/nodes/n\d", 500, times=2)
    for _ in range(2):
        assert (await ekube.error("CoreV1Api", "read_node", "n1")).status == 500
    node = await ekube.call("CoreV1Api", "read_node", "n1")
    assert node.metadata.name == "n1"


async def test_fault_with_body_and_delay(emulator: ApiEmulator, ekube: Kube) -> None:
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 429,
            "reason": "TooManyRequests", "message": "slow down"}
    emulator.fail("*", "/api/v1/nodes", 429, body=body, delay=0.05)
    err = await ekube.error("CoreV1Api", "list_node")
    assert err.status == 429 and "slow down" in err.body
    assert emulator.requests_to(path="/api/v1/nodes")[0].status == 429


async def test_server_goes_away_and_comes_back_on_the_same_port(emulator: ApiEmulator,
                                                                ekube: Kube) -> None:
    emulator.seed(NODE)
    url = emulator.url
    await emulator.go_away()
    with pytest.raises(Exception) as info:
        await ekube.call("CoreV1Api", "read_node", "n1", _request_timeout=2)
    assert "ApiException" not in type(info.value).__name__  # no HTTP answer at all
    await emulator.come_back()
    assert emulator.url == url
    node = await ekube.call("CoreV1Api", "read_node", "n1")
    assert node.metadata.name == "n1"  # objects survive


async def test_going_away_cuts_open_watches(emulator: ApiEmulator) -> None:
    emulator.seed(NODE)
    async with aiohttp.ClientSession() as session, \
            session.get(f"{emulator.url}/api/v1/nodes?watch=true") as resp:
        assert b'"ADDED"' in await resp.content.readline()
        await emulator.go_away()
        with anyio.fail_after(5), pytest.raises(aiohttp.ClientPayloadError):
            await resp.content.read()


async def test_authorizer_denies_with_403(emulator: ApiEmulator) -> None:
    calls = []

    def authorize(user: str, verb: str, group: str, resource: str, sub: str,
                  namespace: str | None, name: str | None) -> bool:
        calls.append((user, verb, group, resource, sub, namespace, name))
        return not (user == "agent" and verb == "delete")

    emulator.authorizer = authorize
    emulator.seed(NODE)
    async with emulator.async_client(user="agent") as client:
        from kubernetes.aio.client import ApiException, CoreV1Api

        await CoreV1Api(client).patch_node_status("n1", {"status": {}})
        with pytest.raises(ApiException) as info:
            await CoreV1Api(client).delete_node("n1")
    assert info.value.status == 403 and "Forbidden" in info.value.body
    assert ("agent", "patch", "", "nodes", "status", None, "n1") in calls
    assert emulator.get("Node", "n1") is not None


async def test_direct_store_access(emulator: ApiEmulator, ekube: Kube) -> None:
    emulator.put({**NODE, "status": {"conditions": [{"type": "Ready", "status": "True"}]}})
    node = await ekube.call("CoreV1Api", "read_node", "n1")
    assert node.status.conditions[0].type == "Ready"  # seeding keeps status
    await ekube.call("CoreV1Api", "patch_node", "n1", {"metadata": {"finalizers": ["x/y"]}})
    stored = emulator.get("Node", "n1")
    assert stored is not None and stored["metadata"]["finalizers"] == ["x/y"]
    emulator.remove("Node", "n1")
    assert emulator.get("nodes", "n1") is None
    assert emulator.list("Node") == []


@pytest.mark.parametrize(("method", "path", "headers", "data", "status"), [
    ("POST", "/api/v1/nodes", {"Content-Type": "application/json"}, "not json", 400),
    ("POST", "/api/v1/nodes", {"Content-Type": "application/yaml"}, "a: b", 415),
    ("PATCH", "/api/v1/nodes/n1", {"Content-Type": "text/plain"}, "{}", 415),
    ("PATCH", "/api/v1/nodes/n1", {"Content-Type": "application/json-patch+json"},
     '[{"op": "bogus"}]', 400),
    ("GET", "/api/v1/nodes?watch=1&resourceVersion=abc", {}, "", 400),
    ("GET", "/api/v1/widgets", {}, "", 404),
    ("PUT", "/api/v1/nodes", {}, "{}", 405),
])
async def test_garbage_gets_a_status_not_a_crash(emulator: ApiEmulator, method: str, path: str,
                                                 headers: dict[str, str], data: str,
                                                 status: int) -> None:
    emulator.seed(NODE)
    async with aiohttp.ClientSession() as session, \
            session.request(method, emulator.url + path, headers=headers, data=data) as resp:
        body = await resp.json()
    assert resp.status == status and body["kind"] == "Status" and body["code"] == status
