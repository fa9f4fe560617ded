"""`RequestTally` on a `Kube` against the emulator: each request is counted under the
kind an operator would name it by, with the bytes the server received, and a
refused request under its own kind."""

from __future__ import annotations

import pytest

from healthd.kube.client import Kube
from healthd.kube.errors import NotFound
from healthd.kube.events import EventRecorder
from healthd.kube.objects import NODES
from healthd.kube.tally import RequestTally, kind_of
from healthd.sim.apiserver import ApiEmulator
from tests.kube.conftest import node

pytestmark = pytest.mark.anyio


async def test_requests_are_counted_by_kind_with_the_bytes_the_server_got(
        api: ApiEmulator, kube: Kube) -> None:
    api.seed(node("gpu-1"))
    kube.tally = RequestTally()
    stored = await kube.get(NODES, "gpu-1")
    await kube.merge_patch(NODES, "gpu-1", {"metadata": {"labels": {"a": "b"}}})
    await EventRecorder(kube, component="test").record(stored, type="Normal", reason="R",
                                                       message="about the node")
    with pytest.raises(NotFound):
        await kube.get(NODES, "gone")

    tally = kube.tally
    assert dict(tally.requests) == {"GET nodes": 1, "PATCH nodes": 1, "POST events/Node": 1,
                                    "GET nodes (error)": 1}
    seen = {r.method: r.size for r in api.recorder.requests}
    assert tally.sent["PATCH nodes"] == seen["PATCH"] > 0
    assert tally.sent["POST events/Node"] == seen["POST"] > 0
    assert tally.sent["GET nodes"] == 0
    assert tally.received["GET nodes"] > 0 and tally.received["PATCH nodes"] > 0


async def test_since_and_per_give_what_one_stretch_cost(api: ApiEmulator, kube: Kube) -> None:
    api.seed(node("gpu-1"))
    kube.tally = RequestTally()
    await kube.get(NODES, "gpu-1")
    before = kube.tally.snapshot()
    for value in ("x", "y"):
        await kube.merge_patch(NODES, "gpu-1", {"metadata": {"labels": {"a": value}}})
    stretch = kube.tally.since(before)
    assert stretch.totals()["requests"] == 2
    per = stretch.per(2)
    assert list(per) == ["PATCH nodes"]
    assert per["PATCH nodes"]["requests"] == 1.0


@pytest.mark.parametrize(("method", "path", "body", "kind"), [
    ("PATCH", "/apis/workload.codeflare.dev/v1beta2/namespaces/t/appwrappers/a/status", None,
     "PATCH appwrappers/status"),
    ("PATCH", "/apis/kueue.x-k8s.io/v1beta2/clusterqueues/slack", None, "PATCH clusterqueues"),
    ("POST", "/api/v1/namespaces/t/events", {"involvedObject": {"kind": "AppWrapper"}},
     "POST events/AppWrapper"),
    ("GET", "/api/v1/namespaces/t", None, "GET namespaces"),
    ("GET", "/api/v1/pods", None, "GET pods"),
    ("GET", "/version", None, "GET /version"),
])
def test_kinds(method: str, path: str, body: object, kind: str) -> None:
    assert kind_of(method, path, body) == kind
