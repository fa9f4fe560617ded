"""Watch streams: JSON lines of `{"type", "object"}` over one chunked HTTP response.

Faithful to the real server where clients notice: `resourceVersion=N` replays only
later events and answers 410 Expired as an ERROR event (HTTP 200) when N is older
than the history; when N is newer than the server's own (a restored or replaced
server) the stream stays silent, bookmarks included, until the server reaches N or
the timeout ends it; no resourceVersion (or "0") starts
with ADDED for every match; an object that stops matching a selector arrives as
DELETED and one that starts matching as ADDED; `timeoutSeconds` ends the stream
cleanly; `allowWatchBookmarks` adds BOOKMARK events, always one just before a
timeout ends the stream. When the server goes away, open watches are cut off
mid-stream.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from aiohttp import web

from healthd.sim.apiserver import deep
from healthd.sim.apiserver.errors import ApiError, status_body
from healthd.sim.apiserver.resources import Obj, ResourceType
from healthd.sim.apiserver.selectors import Selector
from healthd.sim.apiserver.store import Expired, Store, StoreEvent, Subscription, render

_TRUE = ("true", "1", "yes")


def is_watch(query: dict[str, str]) -> bool:
    """`watch=true|True|1` (different clients spell it differently)."""
    return query.get("watch", "").lower() in _TRUE


@dataclass
class WatchRequest:
    """What one watch asks for."""

    rt: ResourceType
    namespace: str | None
    selector: Selector
    since: str | None
    timeout: float | None
    bookmarks: bool

    @classmethod
    def parse(cls, rt: ResourceType, namespace: str | None, selector: Selector,
              query: dict[str, str]) -> WatchRequest:
        timeout = query.get("timeoutSeconds")
        try:
            seconds = float(timeout) if timeout else None
        except ValueError as exc:
            raise ApiError.bad_request(f"invalid timeoutSeconds {timeout!r}") from exc
        return cls(rt, namespace, selector, query.get("resourceVersion"), seconds,
                   query.get("allowWatchBookmarks", "").lower() in _TRUE)

    def _visible(self, obj: Obj | None) -> Obj | None:
        """The object as this watch serves it, or None when outside its selection."""
        if obj is None:
            return None
        if self.namespace is not None and obj["metadata"].get("namespace") != self.namespace:
            return None
        shown = render(obj, self.rt)
        return shown if self.selector.matches(shown) else None

    def translate(self, event: StoreEvent) -> dict[str, object] | None:
        """The event this watcher sees for a store event, if any."""
        now = self._visible(event.obj)
        before = self._visible(event.prev) if event.type == "MODIFIED" else None
        if event.type == "DELETED":
            return {"type": "DELETED", "object": now} if now else None
        if event.type == "ADDED" or before is None:
            return {"type": "ADDED", "object": now} if now else None
        if now is not None:
            return {"type": "MODIFIED", "object": now}
        before["metadata"]["resourceVersion"] = str(event.rv)  # left the selection
        return {"type": "DELETED", "object": before}

    def bookmark(self, rv: int) -> dict[str, object]:
        return {"type": "BOOKMARK", "object": {
            "kind": self.rt.kind, "apiVersion": self.rt.group_version,
            "metadata": {"resourceVersion": str(rv)}}}


async def _send(resp: web.StreamResponse, event: dict[str, object]) -> None:
    await resp.write(deep.dumps(event).encode() + b"\n")


async def _open_stream(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
    resp.enable_chunked_encoding()
    await resp.prepare(request)
    return resp


async def serve_watch(request: web.Request, store: Store, watch: WatchRequest, *,
                      bookmark_interval: float) -> web.StreamResponse:
    """Stream events until the timeout, the client leaves, or the server goes away."""
    loop = asyncio.get_running_loop()
    try:
        sub, initial = store.subscribe(watch.rt, watch.namespace, watch.since, loop)
    except Expired as exc:
        resp = await _open_stream(request)
        await _send(resp, {"type": "ERROR", "object": status_body(410, str(exc), "Expired")})
        return resp
    resp = await _open_stream(request)
    try:
        for event in initial:
            if (shown := watch.translate(event)) is not None:
                await _send(resp, shown)
        await _pump(request, resp, sub, watch, bookmark_interval)
    except (ConnectionResetError, ConnectionError):
        pass  # the client went away
    finally:
        store.unsubscribe(sub)
    return resp


async def _pump(request: web.Request, resp: web.StreamResponse, sub: Subscription,
                watch: WatchRequest, bookmark_interval: float) -> None:
    queue, seen_rv = sub.queue, sub.start_rv
    deadline = None if watch.timeout is None else time.monotonic() + watch.timeout
    next_bookmark = time.monotonic() + bookmark_interval
    while True:
        now = time.monotonic()
        bookmarks = watch.bookmarks and seen_rv >= sub.silent_until
        if deadline is not None and now >= deadline:
            if bookmarks:
                await _send(resp, watch.bookmark(seen_rv))
            return
        wake = min(d for d in (deadline, next_bookmark if bookmarks else None, now + 3600)
                   if d is not None)
        try:
            event = await asyncio.wait_for(queue.get(), timeout=max(0.0, wake - now))
        except TimeoutError:
            if bookmarks and time.monotonic() >= next_bookmark:
                await _send(resp, watch.bookmark(seen_rv))
                next_bookmark = time.monotonic() + bookmark_interval
            continue
        if event is None:  # the server is going away: cut the connection like a crash
            if request.transport is not None:
                request.transport.abort()
            raise ConnectionResetError("server went away")
        if event.rv <= sub.silent_until:
            continue
        seen_rv = event.rv
        if (shown := watch.translate(event)) is not None:
            await _send(resp, shown)
