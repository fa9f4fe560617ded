"""A loopback TCP proxy that can freeze the connections it carries.

`FreezingProxy(host, port)` forwards every connection made to `127.0.0.1:<its port>`
to `host:port`, bytes unchanged (TLS passes through). `freeze()` makes every
connection established so far go silent both ways, as after a load-balancer
failover or a conntrack flush: nothing more is forwarded, and neither side gets a
FIN or an RST (the sockets stay open, unread). Connections made afterwards are
forwarded as usual.

On the test's own event loop::

    async with FreezingProxy("127.0.0.1", api.port) as proxy:
        ...  # clients talk to proxy.url
        proxy.freeze()

From synchronous code (a thread runs the proxy's loop)::

    with threaded_proxy("127.0.0.1", apiserver_port) as proxy:
        proxy.freeze()
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import TracebackType

_CHUNK = 65536


@dataclass
class _Link:
    """One client connection and its connection to the target."""

    writers: tuple[asyncio.StreamWriter, asyncio.StreamWriter]
    pumps: list[asyncio.Task[None]] = field(default_factory=list)
    frozen: bool = False


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Forward bytes until the end of the stream; pass the end on."""
    with contextlib.suppress(OSError):
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()


class FreezingProxy:
    """See the module docstring."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self._links: list[_Link] = []
        self._server: asyncio.Server | None = None
        self.port = 0

    @property
    def url(self) -> str:
        """The proxy's address for an `http://` target."""
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> FreezingProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        link = _Link((writer, upstream))
        link.pumps = [asyncio.create_task(_pump(reader, upstream)),
                      asyncio.create_task(_pump(upstream_reader, writer))]
        self._links.append(link)

    def freeze(self) -> int:
        """Silence every connection established so far; how many there were."""
        frozen = 0
        for link in self._links:
            if link.frozen or all(p.done() for p in link.pumps):
                continue
            for pump in link.pumps:
                pump.cancel()
            link.frozen = True  # its sockets stay open: no FIN, no RST
            frozen += 1
        return frozen

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for link in self._links:
            for pump in link.pumps:
                pump.cancel()
            for writer in link.writers:
                writer.close()
        self._links.clear()

    async def __aenter__(self) -> FreezingProxy:
        return await self.start()

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()


class ThreadedProxy:
    """A `FreezingProxy` on its own event loop in a thread, for synchronous tests."""

    def __init__(self, proxy: FreezingProxy, loop: asyncio.AbstractEventLoop) -> None:
        self._proxy = proxy
        self._loop = loop

    @property
    def port(self) -> int:
        return self._proxy.port

    def freeze(self) -> int:
        async def freeze() -> int:
            return self._proxy.freeze()
        return asyncio.run_coroutine_threadsafe(freeze(), self._loop).result(10)


@contextlib.contextmanager
def threaded_proxy(host: str, port: int) -> Iterator[ThreadedProxy]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="freezing-proxy", daemon=True)
    thread.start()
    proxy = FreezingProxy(host, port)
    asyncio.run_coroutine_threadsafe(proxy.start(), loop).result(10)
    try:
        yield ThreadedProxy(proxy, loop)
    finally:
        asyncio.run_coroutine_threadsafe(proxy.close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
