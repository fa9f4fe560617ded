"""The agent's HTTP port under a flood from the pod network: thousands of idle
connections and senders that trickle a byte at a time. /healthz and /metrics still
answer, and the server closes what holds it (the oldest waiting connection when too
many are open, anything that has not sent its request within the deadline)."""

from __future__ import annotations

import resource
import socket
import threading

import anyio
import pytest
from prometheus_client import CollectorRegistry

from healthd.util.http import serve_http
from tests.agent_metrics.test_http import alive, get

pytestmark = pytest.mark.anyio

IDLE = 3000
TRICKLERS = 20
DEADLINE_S = 1.0


@pytest.fixture
def many_fds() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = IDLE + TRICKLERS + 500
    if hard != resource.RLIM_INFINITY and hard < wanted:
        pytest.skip(f"the fd limit ({hard}) is below the {wanted} this flood needs")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def open_idle(port: int, count: int) -> list[socket.socket]:
    """Connect `count` times and send nothing; a connect the server never accepts
    within 2 s is left out."""
    out = []
    for _ in range(count):
        sock = socket.socket()
        sock.settimeout(2.0)
        try:
            sock.connect(("127.0.0.1", port))
        except OSError:
            sock.close()
            continue
        out.append(sock)
    return out


def trickle(port: int, stop: threading.Event, closed: list[bool]) -> None:
    """Send a request one byte every 0.2 s; note whether the server hung up."""
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 10_000
    with socket.create_connection(("127.0.0.1", port), timeout=2.0) as sock:
        for byte in request:
            if stop.is_set():
                break
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                closed.append(True)
                return
            stop.wait(0.2)
        closed.append(server_hung_up(sock))


def server_hung_up(sock: socket.socket) -> bool:
    try:
        sock.settimeout(0.5)
        return sock.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except OSError:  # timed out: still open
        return False


async def test_probes_answer_during_a_flood_and_holders_are_closed(
    registry: CollectorRegistry, many_fds: None
) -> None:
    async with serve_http(0, registry, healthy=alive, ready=alive, host="127.0.0.1",
                          deadline_s=DEADLINE_S) as port:
        stop, trickled_closed = threading.Event(), []
        tricklers = [threading.Thread(target=trickle, args=(port, stop, trickled_closed))
                     for _ in range(TRICKLERS)]
        for thread in tricklers:
            thread.start()
        answers = []
        idle: list[socket.socket] = []

        async def flood() -> None:
            idle.extend(await anyio.to_thread.run_sync(open_idle, port, IDLE))

        async def probe() -> None:
            for _ in range(10):
                with anyio.fail_after(5):
                    answers.append((await get(port, "/healthz"))[0])
                    answers.append((await get(port, "/metrics"))[0])
                await anyio.sleep(0.2)

        async with anyio.create_task_group() as group:
            group.start_soon(flood)
            group.start_soon(probe)
        await anyio.sleep(DEADLINE_S + 2.0)  # past the deadline, with the reaper's poll
        closed = sum(await anyio.to_thread.run_sync(lambda: [server_hung_up(s) for s in idle]))
        stop.set()
        for thread in tricklers:
            await anyio.to_thread.run_sync(thread.join)
        for sock in idle:
            sock.close()
    assert answers == [200] * 20
    assert len(idle) >= IDLE * 0.9  # the backlog took the burst
    assert closed == len(idle)  # every idle connection was closed by the server
    assert trickled_closed == [True] * TRICKLERS
