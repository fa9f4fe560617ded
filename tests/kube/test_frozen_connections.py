"""Connections that go silent (no FIN, no RST: a load-balancer failover, a conntrack
flush) while new ones work, through `FreezingProxy` in front of the emulator: a
request on one times out at its deadline and the next request goes out over a fresh
connection, even with more silent ones left in the pool; a watch on one is given up
within its server-side timeout plus the client's margin and resumes; an open watch
whose connection is dropped resumes at once; the client's sockets keep TCP
keepalive on."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest

from healthd.kube import errors
from healthd.kube.backoff import Backoff
from healthd.kube.client import Kube, keepalive_socket
from healthd.kube.objects import NODES
from healthd.kube.watching import watch_forever
from healthd.sim.apiserver import ApiEmulator
from healthd.sim.apiserver.kubeconfig import async_api_client
from tests.kube.conftest import node
from tests.kube.freezing_proxy import FreezingProxy

pytestmark = pytest.mark.anyio


@pytest.fixture
async def proxy(api: ApiEmulator) -> AsyncIterator[FreezingProxy]:
    async with FreezingProxy(api.host, api.port) as running:
        yield running


async def test_after_a_request_times_out_the_next_goes_out_over_a_fresh_connection(
        api: ApiEmulator, proxy: FreezingProxy) -> None:
    api.seed(node("n1"))
    async with Kube(async_api_client(proxy.url), timeout_s=1) as kube:
        async with anyio.create_task_group() as group:  # several pooled connections
            for _ in range(4):
                group.start_soon(kube.get, NODES, "n1")
        assert proxy.freeze() >= 2
        with pytest.raises(errors.Unavailable) as info:
            await kube.get(NODES, "n1")
        assert info.value.reason == "Timeout"
        # Not the next silent connection of the pool: a new one, answered at once.
        assert (await kube.get(NODES, "n1"))["metadata"]["name"] == "n1"


@asynccontextmanager
async def following(kube: Kube) -> AsyncIterator[list[str]]:
    """`watch_forever` on Nodes in the background: the names it saw, once the first."""
    seen: list[str] = []

    async def follow() -> None:
        async for event in watch_forever(kube, NODES, backoff=Backoff(initial=0.05,
                                                                      maximum=0.1)):
            seen.append(event.object["metadata"]["name"])

    async with anyio.create_task_group() as group:
        group.start_soon(follow)
        await sees(seen, "n1", 5)
        yield seen
        group.cancel_scope.cancel()


async def sees(seen: list[str], name: str, within: float) -> None:
    with anyio.fail_after(within):
        while name not in seen:
            await anyio.sleep(0.02)


async def test_a_silent_watch_is_given_up_and_resumed_within_its_timeout_and_margin(
        api: ApiEmulator, proxy: FreezingProxy) -> None:
    api.seed(node("n1"))
    async with Kube(async_api_client(proxy.url), timeout_s=1, watch_timeout_s=2,
                    watch_read_margin_s=1) as kube, following(kube) as seen:
        assert proxy.freeze() >= 1
        api.seed(node("n2"))
        await sees(seen, "n2", 6)  # given up 2 + 1 s after its last byte at the latest


async def test_an_open_watch_resumes_at_once_when_the_connections_are_dropped(
        api: ApiEmulator) -> None:
    api.seed(node("n1"))
    async with Kube(api.async_client(), timeout_s=1) as kube, following(kube) as seen:
        await kube.drop_connections()
        api.seed(node("n2"))
        await sees(seen, "n2", 5)  # not at the end of the watch's 60 + 10 s


def test_the_clients_sockets_keep_tcp_keepalive_on() -> None:
    with keepalive_socket((socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)) as sock:
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        if hasattr(socket, "TCP_KEEPIDLE"):
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 30
