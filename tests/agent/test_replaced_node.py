"""The Node loses what the agent published, without the agent doing anything: it
is deleted and registered again by its kubelet, or the API server is replaced by a
fresh one (etcd restored, a new control plane: resourceVersions start again) and the
Nodes register again without healthd's keys. The agent notices (its watch relists,
or sees the keys gone) and publishes again at once, not at its next change. (On a
fresh server the Node's versions are lower than the last one the agent saw, and its
watch's resume point is a version that server never had: the server keeps such a
watch silent, so the agent learns of it when the watch ends, and relists.)"""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from healthd.kube.client import Kube
from healthd.sim.apiserver import ApiEmulator
from tests.agent.harness import KEYS, NODE, Harness, eventually, node_object, running_agent

pytestmark = pytest.mark.anyio


def published(h: Harness) -> bool:
    return h.verdict() == "PASS" and KEYS.health in h.annotations() and (
        (h.condition() or {}).get("status") == "False")


async def test_a_node_deleted_and_registered_again_gets_its_state_back(
        api: ApiEmulator, tmp_path: Path) -> None:
    async with running_agent(api, tmp_path) as h:
        await eventually(lambda: published(h), 10, "the first verdict")
        api.remove("Node", NODE)
        api.seed(node_object())  # the kubelet registers it again, without healthd's keys
        assert not published(h)
        await eventually(lambda: published(h), 10, "the state back on the new Node")


async def test_a_fresh_api_server_gets_the_state_back(tmp_path: Path) -> None:
    async with AsyncExitStack() as stack:
        first = await stack.enter_async_context(ApiEmulator())
        # The fresh server accepts a watch from a version it never had and keeps it
        # silent; the agent finds out when that watch ends: a short one here.
        kube = await stack.enter_async_context(Kube(first.async_client(), timeout_s=2,
                                                    watch_timeout_s=2))
        h = await stack.enter_async_context(running_agent(first, tmp_path, kube=kube))
        await eventually(lambda: published(h), 10, "the first verdict")
        h.sim.nvml.emit_xid(3, 79)
        await eventually(lambda: h.verdict() == "EVICT", 10, "EVICT on the first server")
        await first.go_away()
        fresh = await stack.enter_async_context(ApiEmulator(port=first.port))
        fresh.seed(node_object())  # registered again: versions start again, no healthd key
        h.api = fresh
        assert h.verdict() is None
        # The label, the annotations and the condition are two writes: the second may
        # meet a connection the old server left behind and be retried after a backoff.
        await eventually(lambda: h.verdict() == "EVICT" and KEYS.health in h.annotations()
                         and (h.condition() or {}).get("status") == "True",
                         30, "the state back on the fresh server")
