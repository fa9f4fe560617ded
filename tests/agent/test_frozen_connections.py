"""Every connection the agent has to the API server goes silent at once (no FIN, no
RST: a load-balancer failover, a conntrack flush) while new connections work. An
on-demand request written right after is still answered, within the watch's
timeout plus the client's margin (the agent itself writes nothing meanwhile, so
only that bound brings its Node watch back), and an XID still turns the node EVICT.

The client's deadlines are shortened here (a 2 s watch, a 1 s margin) to keep the
test fast; the defaults and the bound they give are in docs/."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from healthd.kube.client import Kube
from healthd.sim.apiserver import ApiEmulator
from healthd.sim.apiserver.kubeconfig import async_api_client
from tests.agent.harness import KEYS, Harness, eventually, running_agent
from tests.kube.freezing_proxy import FreezingProxy

pytestmark = pytest.mark.anyio


@pytest.fixture
async def proxy(api: ApiEmulator) -> AsyncIterator[FreezingProxy]:
    async with FreezingProxy(api.host, api.port) as running:
        yield running


def answer_to(h: Harness, run_id: str) -> dict[str, object] | None:
    answer = h.last_run()
    return answer if answer and answer.get("id") == run_id else None


async def test_an_on_demand_request_after_a_freeze_is_answered(
        api: ApiEmulator, proxy: FreezingProxy, tmp_path: Path) -> None:
    async with Kube(async_api_client(proxy.url), timeout_s=2, watch_timeout_s=2,
                    watch_read_margin_s=1) as kube, running_agent(api, tmp_path,
                                                                  kube=kube) as h:
        await eventually(lambda: h.verdict() == "PASS", 10, "the first verdict")
        assert proxy.freeze() >= 1
        h.request("remapped", run_id="after-freeze")
        answer = await eventually(lambda: answer_to(h, "after-freeze"), 8,
                                  "the answer after the freeze")
        assert answer["verdict"] == "PASS"
        h.sim.nvml.emit_xid(3, 79)
        await eventually(lambda: h.verdict() == "EVICT", 8, "EVICT after the freeze")
        assert KEYS.health in h.annotations()
