"""Clients on the pod network that reset their connection before the answer: the
daemon's HTTP server logs no traceback for them (its log stays the JSON log), counts
them in `healthd_http_clients_gone_total`, and keeps answering everyone else."""

from __future__ import annotations

import socket
import struct

import anyio
import pytest
from prometheus_client import CollectorRegistry, Gauge

from healthd.util.http import serve_http
from tests.agent_metrics.test_http import alive, get

pytestmark = pytest.mark.anyio

RESETS = 200


def reset_after_request(port: int) -> None:
    """Ask for /metrics and hang up at once with an RST (SO_LINGER 0), before the
    answer can be written."""
    with socket.create_connection(("127.0.0.1", port), timeout=2.0) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")


async def test_clients_that_reset_are_counted_not_printed(
        capfd: pytest.CaptureFixture[str]) -> None:
    registry = CollectorRegistry()
    big = Gauge("big_family", "an answer of about 50 kB", ["n"], registry=registry)
    for n in range(1000):
        big.labels(str(n)).set(n)
    async with serve_http(0, registry, healthy=alive, ready=alive, host="127.0.0.1") as port:
        for _ in range(RESETS):
            await anyio.to_thread.run_sync(reset_after_request, port)
        gone = 0.0
        with anyio.fail_after(10):
            while gone == 0:  # the server threads notice the resets on their own time
                await anyio.sleep(0.1)
                gone = registry.get_sample_value("healthd_http_clients_gone_total") or 0.0
        assert (await get(port, "/healthz"))[0] == 200
        await anyio.sleep(0.5)  # what the last resets print, if anything
    assert 0 < gone <= RESETS
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Error" not in err, err[:2000]


async def test_the_count_is_on_the_daemons_registry_only_while_serving() -> None:
    registry = CollectorRegistry()
    async with serve_http(0, registry, healthy=alive, ready=alive, host="127.0.0.1"):
        assert registry.get_sample_value("healthd_http_clients_gone_total") == 0
    assert registry.get_sample_value("healthd_http_clients_gone_total") is None
