"""The agent on an API server whose etcd was restored from a backup taken while its
Node showed PASS, after the agent had published EVICT: the Node is back to the
backup's PASS with an older resourceVersion, and the restored server's new writes
pass the version the agent's watch saw before the watch comes back, so resuming it
would show nothing. The agent's watch rereads its one Node whenever a stream ends,
compares content, and the agent publishes EVICT again, well within one watch period
(60 s by default)."""

from __future__ import annotations

from pathlib import Path

import pytest

from healthd.sim.apiserver import ApiEmulator
from tests.agent.harness import KEYS, eventually, running_agent
from tests.kube.conftest import churn

pytestmark = pytest.mark.anyio


async def test_a_node_restored_to_pass_shows_evict_again(api: ApiEmulator,
                                                        tmp_path: Path) -> None:
    async with running_agent(api, tmp_path) as h:
        await eventually(lambda: h.verdict() == "PASS", 10, "the first verdict")
        backup = api.snapshot()
        h.sim.nvml.emit_xid(3, 79)
        await eventually(lambda: h.verdict() == "EVICT", 10, "EVICT")
        await eventually(lambda: h.parts.publisher.in_sync, 10, "the agent's writes done")

        seen = api.resource_version
        api.restore(backup)
        churn(api, past=seen)  # the agent's watch comes back past what it saw
        assert h.verdict() == "PASS"

        await eventually(lambda: h.verdict() == "EVICT", 20, "EVICT again")
        assert await h.parts.publisher.flush(10)  # the condition is its own write
        assert (h.condition() or {}).get("status") == "True"
        assert "XID_79" in h.annotations()[KEYS.health]
