"""A batched watch waits with its socket unread, on TLS too (the real API server's
connections): what the server sends meanwhile stays in the kernel, so a quarter
second of Node heartbeats costs the process one wake-up, not one per heartbeat; and
it is all read, intact, once the wait ends.

asyncio's TLS transport goes on reading its socket while paused (it only stops
handing data up), so this is what `_socket_unread` adds; a plain TCP transport's
pause already leaves the socket alone."""

from __future__ import annotations

import array
import asyncio
import fcntl
import ssl
import termios
from pathlib import Path

import pytest

from healthd.kube.client import _socket_unread
from tests.realcluster import pki

pytestmark = pytest.mark.anyio
SENT = b"x" * 20_000  # a few heartbeats' worth


def unread_bytes(transport: asyncio.BaseTransport) -> int:
    """What the kernel holds for the transport's socket, not read yet (FIONREAD)."""
    count = array.array("i", [0])
    fcntl.ioctl(transport.get_extra_info("socket").fileno(), termios.FIONREAD, count)
    return count[0]


async def test_a_paused_tls_stream_leaves_what_comes_in_the_socket_and_reads_it_after(
        tmp_path: Path) -> None:
    certs = pki.make(tmp_path / "pki")
    serving = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    serving.load_cert_chain(certs / "apiserver.crt", certs / "apiserver.key")
    go = asyncio.Event()

    async def serve(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await go.wait()
        writer.write(SENT)
        await writer.drain()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=serving)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=ssl.create_default_context(cafile=certs / "ca.crt"))
    transport = writer.transport
    limits = transport.get_read_buffer_limits()  # type: ignore[attr-defined]
    try:
        with _socket_unread(transport):
            transport.pause_reading()  # type: ignore[attr-defined]
            go.set()
            await asyncio.sleep(0.3)  # the batch's wait
            held = unread_bytes(transport)
            transport.resume_reading()  # type: ignore[attr-defined]
        assert held > len(SENT)  # all of it (and TLS's framing) waited in the kernel
        assert await asyncio.wait_for(reader.readexactly(len(SENT)), 5) == SENT
        # Its flow control as it was: later reads are not paused at every byte.
        assert transport.get_read_buffer_limits() == limits  # type: ignore[attr-defined]
    finally:
        writer.close()
        server.close()
        await server.wait_closed()
