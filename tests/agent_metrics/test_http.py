"""The agent's HTTP endpoint over real HTTP: /metrics in Prometheus format, /healthz
and /readyz with their reasons, 404 and 405 for anything else, and a clear error for
a port that is taken."""

from __future__ import annotations

import socket

import aiohttp
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from healthd.agent.metrics import AgentMetrics
from healthd.util.http import serve_http
from tests.agent_metrics.conftest import NODE, remapped

pytestmark = pytest.mark.anyio


class Readiness:
    """A probe the test flips, as the agent does after its first round."""

    def __init__(self) -> None:
        self.ok, self.reason = False, "first round not done"

    def __call__(self) -> tuple[bool, str]:
        return self.ok, self.reason


def alive() -> tuple[bool, str]:
    return True, ""


def broken() -> tuple[bool, str]:
    raise RuntimeError("state unreadable")


async def get(port: int, path: str, method: str = "GET", **kw) -> tuple[int, str, str]:
    async with aiohttp.ClientSession() as session, session.request(
        method, f"http://127.0.0.1:{port}{path}", **kw
    ) as response:
        return response.status, response.headers.get("Content-Type", ""), await response.text()


async def test_metrics_endpoint_serves_valid_exposition(
    metrics: AgentMetrics, registry: CollectorRegistry
) -> None:
    metrics.observe_result("remapped", remapped(range(2), pending=(1,)))
    async with serve_http(0, registry, healthy=alive, ready=alive, host="127.0.0.1") as port:
        status, content_type, body = await get(port, "/metrics")
    assert status == 200
    assert content_type.startswith("text/plain") and "version=0.0.4" in content_type
    families = {f.name: f for f in text_string_to_metric_families(body)}
    samples = {
        (s.labels["health"], s.labels["deviceid"]): s.value
        for s in families["autopilot_health_checks"].samples
    }
    assert samples == {("remapped", "0"): 0, ("remapped", "1"): 1}
    assert all(s.labels["node"] == NODE for s in families["healthd_check_status"].samples)


async def test_openmetrics_when_the_scraper_asks(registry: CollectorRegistry) -> None:
    async with serve_http(0, registry, healthy=alive, ready=alive, host="127.0.0.1") as port:
        accept = {"Accept": "application/openmetrics-text; version=1.0.0"}
        status, content_type, body = await get(port, "/metrics", headers=accept)
    assert status == 200
    assert content_type.startswith("application/openmetrics-text")
    assert body.endswith("# EOF\n")


async def test_probes_answer_with_their_reason(registry: CollectorRegistry) -> None:
    ready = Readiness()
    async with serve_http(0, registry, healthy=alive, ready=ready, host="127.0.0.1") as port:
        assert await get(port, "/healthz") == (200, "text/plain; charset=utf-8", "ok\n")
        status, _, body = await get(port, "/readyz")
        assert (status, body) == (503, "first round not done\n")
        ready.ok = True
        status, _, body = await get(port, "/readyz")
        assert (status, body) == (200, "ok\n")


async def test_probe_that_raises_is_a_503_not_a_crash(registry: CollectorRegistry) -> None:
    async with serve_http(0, registry, healthy=broken, ready=alive, host="127.0.0.1") as port:
        status, _, body = await get(port, "/healthz")
        assert status == 503 and "state unreadable" in body
        assert (await get(port, "/readyz"))[0] == 200  # the server is still there


async def test_nothing_else_is_served(registry: CollectorRegistry) -> None:
    async with serve_http(0, registry, healthy=alive, ready=alive, host="127.0.0.1") as port:
        assert (await get(port, "/metrics", "POST"))[0] == 405
        assert (await get(port, "/readyz", "DELETE"))[0] == 405
        assert (await get(port, "/other"))[0] == 404
        assert (await get(port, "/"))[0] == 404


async def test_port_in_use_names_the_address(registry: CollectorRegistry) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=f"cannot serve HTTP on 127.0.0.1:{port}"):
            async with serve_http(port, registry, healthy=alive, ready=alive, host="127.0.0.1"):
                pass
