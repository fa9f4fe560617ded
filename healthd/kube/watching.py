"""Watching collections: one watch request, and the endless list-watch loop.

`watch` is one `watch=true` request: a stream of ADDED/MODIFIED/DELETED events
from a resourceVersion, ended by the server's `timeoutSeconds`. BOOKMARKs only move
the resume point and are not yielded; an expired resourceVersion raises `Gone`.

`watch_forever` is what every cache and loop in healthd uses (no polling anywhere):
list, then watch from the list's resourceVersion, resume from the last version
seen whenever a stream ends or breaks, relist when the version expired (410) and
turn the difference into events (ADDED for what is new, MODIFIED for what differs
from the copy last yielded, DELETED for what vanished meanwhile), and wait with
backoff and jitter while the server is unreachable. It never raises `KubeError` and
runs until cancelled.

Lists come in pages of `page_size` (`limit`/`continue`, 500 as client-go's
reflector asks), so the first sync of a large cluster never asks the server for one
giant response; a continue token that expired mid-list (410) starts the list again.
A relist is applied page by page against what was yielded: an object that did not
change keeps its stored copy, so what a relist holds at once is the store plus one
page, not two stores.

`project` (a cache's transform, healthd.kube.projections) cuts every object down
before it is remembered or yielded; then an event whose projection differs from the
one yielded last in nothing but its resourceVersion is not yielded at all (the
stored copy takes the new version in place): a Node heartbeat costs a decode and a
compare. `listed` is called each time a full list has been yielded (a cache learns
it is synced).

The server's history can move back: etcd restored from a backup starts again at
the backup's revision, below the versions clients last saw, and ordinary churn
(heartbeats, Events) passes them within seconds. A watch resumed from such a
version is accepted, and misses for good whatever the restored server holds from
before that version. Versions cannot tell that story; content can, so:

- after a stream cut short (an error, a server going away, an end before its
  timeout) or silent for a whole period, a one-item list without a version asks
  for the server's current one: below the version last seen, the history moved
  back, and the watch relists. One small read after an abnormal end only; it
  catches a restore whenever the watch reconnects before the restored server
  passes its version, the usual case (a restore restarts the API server);
- `reread=True` relists at the end of every stream, whatever the versions say:
  for a watch of one object (the agent's own Node) one small read per watch
  period, and the signal that still holds when the server passed the version
  before the watch came back. A relist compares content, so a restored copy with
  an older version is yielded as MODIFIED;
- `Rewinds`, shared by the watches of one client, spreads the news: when one of
  them, or another witness (the controller's Lease), notices the history moved
  back, it is logged once and every sharing watch relists at once, one waiting
  for its next event included.

Usage::

    async for event in watch_forever(kube, NODES, field_selector=f"metadata.name={node}"):
        handle(event.type, event.object)
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from contextlib import aclosing, contextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio

from healthd.kube.backoff import Backoff
from healthd.kube.client import Kube, Query
from healthd.kube.errors import Gone, KubeError, from_status_object
from healthd.kube.objects import Resource, items_of, key_of, meta, resource_version_of
from healthd.kube.projections import Projection, unchanged

log = logging.getLogger(__name__)

ADDED = "ADDED"
MODIFIED = "MODIFIED"
DELETED = "DELETED"
BOOKMARK = "BOOKMARK"
_KINDS = frozenset({ADDED, MODIFIED, DELETED, BOOKMARK})
_QUICK_END_S = 1.0  # a stream that ends this fast with nothing in it earns a backoff
LIST_PAGE = 500  # objects per list page (client-go's reflector asks for as many)


@dataclass(frozen=True)
class WatchEvent:
    """One change: `type` is ADDED, MODIFIED or DELETED; `object` the object as sent."""

    type: str
    object: dict[str, Any]


async def _stream(kube: Kube, res: Resource, namespace: str | None, *,
                  label_selector: str | None, field_selector: str | None,
                  resource_version: str | None, timeout_s: int | None,
                  batch_s: float = 0) -> AsyncGenerator[WatchEvent, None]:
    """One watch request, BOOKMARKs included; ERROR events raise their error. A
    stream silent past its timeout plus the client's margin is a dead connection."""
    timeout_s = kube.watch_timeout_s if timeout_s is None else timeout_s
    query = {"watch": True, "allowWatchBookmarks": True, "timeoutSeconds": timeout_s,
             "labelSelector": label_selector, "fieldSelector": field_selector,
             "resourceVersion": resource_version}
    lines = kube.stream(res.path(namespace), query=query,
                        read_timeout_s=timeout_s + kube.watch_read_margin_s, batch_s=batch_s)
    async with aclosing(lines):
        async for line in lines:
            kind, obj = line.get("type"), line.get("object")
            if kind == "ERROR":
                raise from_status_object(obj if isinstance(obj, dict) else {})
            if kind in _KINDS and isinstance(obj, dict):
                yield WatchEvent(str(kind), obj)
            else:
                log.debug("ignoring watch line of type %r on %s", kind, res)


async def watch(kube: Kube, res: Resource, namespace: str | None = None, *,
                label_selector: str | None = None, field_selector: str | None = None,
                resource_version: str | None = None,
                timeout_s: int | None = None) -> AsyncGenerator[WatchEvent, None]:
    """One watch request; raises `Gone` on 410 (and other `KubeError`s as they come).
    `timeout_s` is the server-side timeout (None: the client's `watch_timeout_s`).

    Without `resource_version` the server starts with ADDED for every current object.
    """
    events = _stream(kube, res, namespace, label_selector=label_selector,
                     field_selector=field_selector, resource_version=resource_version,
                     timeout_s=timeout_s)
    async with aclosing(events):
        async for event in events:
            if event.type != BOOKMARK:
                yield event


def older_version(version: str | None, than: str | None) -> bool:
    """Whether resourceVersion `version` comes before `than`. Versions are opaque by
    contract, but every real server's are etcd revisions: integers that only grow
    within one history. Opaque ones are never called older."""
    return bool(version and than and version.isdigit() and than.isdigit()
                and int(version) < int(than))


class Rewinds:
    """The API server's history moving back, as the watches sharing this object (and
    any other witness) notice it; see the module docstring.

    `count` is how many times it was noticed. `notice` counts one more, logs it,
    makes every sharing watch relist (waking one that waits for its next event) and
    calls the listeners: what a process remembers of its own writes may belong to
    the history the server lost.
    """

    def __init__(self) -> None:
        self.count = 0
        self._waiting: set[anyio.CancelScope] = set()
        self._listeners: list[Callable[[], None]] = []

    def notice(self, why: str) -> None:
        self.count += 1
        log.warning("the API server's history moved back (%s): every watch relists", why)
        for scope in list(self._waiting):
            scope.cancel()
        for listener in list(self._listeners):
            listener()

    @contextmanager
    def listening(self, listener: Callable[[], None]) -> Iterator[None]:
        """`listener()` runs on every notice while inside."""
        self._listeners.append(listener)
        try:
            yield
        finally:
            self._listeners.remove(listener)

    async def next(self, events: AsyncIterator[WatchEvent], listed_at: int) -> WatchEvent | None:
        """The next of `events`; None when they end, or once the history moved back
        after `listed_at` (the count when the watch last listed), even mid-wait."""
        if self.count != listed_at:
            return None
        # The scope covers the wait only, never a yield to the watch's consumer.
        with anyio.CancelScope() as scope:
            self._waiting.add(scope)
            try:
                return await anext(events)
            except StopAsyncIteration:
                return None
            finally:
                self._waiting.discard(scope)
        return None


async def _next(events: AsyncIterator[WatchEvent], _listed_at: int) -> WatchEvent | None:
    return await anext(events, None)


def _typed(item: dict[str, Any], res: Resource) -> dict[str, Any]:
    """A List's item with the `apiVersion` and `kind` that a built-in kind's List
    names once and leaves out of its items (client-go's decoder sets them too): a
    listed copy and a watched one of the same object compare equal."""
    if res.kind:
        item.setdefault("apiVersion", res.api_version)
        item.setdefault("kind", res.kind)
    return item


def _same(before: dict[str, Any], obj: dict[str, Any], projected: bool) -> bool:
    """Whether `obj` shows nothing new over `before`, the copy last yielded. Whole
    objects compare whole: content decides, not versions, so a restored copy with an
    older version is news. Projections compare without their versions, and the
    stored copy takes the new one in place (cheap, and writers guard on it)."""
    if not projected:
        return before == obj
    if not unchanged(before, obj):
        return False
    version = resource_version_of(obj)
    if version is not None:
        meta(before)["resourceVersion"] = version
    return True


@dataclass
class _Position:
    """Where one list-watch stands: what it yielded, the version to resume from (None:
    list first), the rewind count at its last list, and whether its last stream
    ended abnormally (the server may have lost the history since)."""

    res: Resource
    namespace: str | None
    selectors: dict[str, str | None]
    rewinds: Rewinds
    project: Projection | None = None
    page_size: int = LIST_PAGE
    known: dict[str, dict[str, Any]] = field(default_factory=dict)
    version: str | None = None
    listed_at: int = 0
    doubt: bool = False

    def moved_back(self, current: str | None) -> bool:
        """Whether the server, now at version `current`, lost the history this watch
        saw; noticed once (a watch that relists for a known rewind says nothing)."""
        if self.rewinds.count != self.listed_at or not older_version(current, self.version):
            return False
        self.rewinds.notice(f"{self.res.plural} at version {current}, "
                            f"after version {self.version} was seen")
        return True

    async def must_relist(self, kube: Kube, reread: bool) -> bool:
        """Before (re)watching: relist, or resume from `version`?"""
        if self.version is None or reread or self.rewinds.count != self.listed_at:
            return True
        if not self.doubt:
            return False
        query: Query = {"limit": 1, "labelSelector": self.selectors["label_selector"],
                        "fieldSelector": self.selectors["field_selector"]}
        probe = await kube.request("GET", self.res.path(self.namespace), query=query)
        self.doubt = False
        return self.moved_back(resource_version_of(probe))

    def received(self, obj: dict[str, Any]) -> dict[str, Any]:
        """An object as this watch keeps and yields it."""
        return self.project(obj) if self.project is not None else obj

    def news(self, event: WatchEvent) -> WatchEvent | None:
        """A watch event as yielded (projected), remembered; None when it shows
        nothing new over the copy last yielded."""
        obj = self.received(event.object)
        key = key_of(obj)
        before = self.known.get(key)
        if event.type == DELETED:
            self.known.pop(key, None)
        elif self.project is not None and before is not None and _same(before, obj, True):
            return None
        else:
            self.known[key] = obj
        return WatchEvent(event.type, obj)

    async def relist(self, kube: Kube) -> AsyncGenerator[WatchEvent, None]:
        """List page by page; the events that bring what was yielded up to the
        listing: ADDED and MODIFIED as each page arrives, DELETED at the end."""
        seen: set[str] = set()
        current: str | None = None
        token: str | None = None
        while True:
            try:
                listing = await kube.list(self.res, self.namespace, limit=self.page_size,
                                          continue_token=token, **self.selectors)
            except Gone:
                if token is None:
                    raise
                log.info("list of %s expired between pages: listing again", self.res)
                seen, token = set(), None
                continue
            if token is None:  # the first page: every page is of its version
                current = resource_version_of(listing)
                self.moved_back(current)  # for a reread: say so, though it relists anyway
            for item in items_of(listing, dict):
                change = self._listed(self.received(_typed(item, self.res)), seen)
                if change is not None:
                    yield change
            token = str(meta(listing).get("continue") or "") or None
            del listing  # a page at a time
            if token is None:
                break
        for key in [k for k in self.known if k not in seen]:
            yield WatchEvent(DELETED, self.known.pop(key))
        self.version, self.listed_at, self.doubt = current or "", self.rewinds.count, False

    def _listed(self, obj: dict[str, Any], seen: set[str]) -> WatchEvent | None:
        key = key_of(obj)
        seen.add(key)
        before = self.known.get(key)
        if before is not None and _same(before, obj, self.project is not None):
            return None
        self.known[key] = obj
        return WatchEvent(ADDED if before is None else MODIFIED, obj)


async def watch_forever(kube: Kube, res: Resource, namespace: str | None = None, *,
                        label_selector: str | None = None, field_selector: str | None = None,
                        backoff: Backoff | None = None, timeout_s: int | None = None,
                        reread: bool = False, rewinds: Rewinds | None = None,
                        project: Projection | None = None,
                        listed: Callable[[], None] | None = None,
                        page_size: int = LIST_PAGE,
                        batch_s: float = 0) -> AsyncGenerator[WatchEvent, None]:
    """List, then watch and resume forever; relist on 410 and when the server's
    history moved back; back off while unreachable. `reread` relists at the end of
    every stream; `rewinds` is shared with the client's other watches; `project`,
    `listed` and `page_size` as in the module docstring; `batch_s` reads the
    stream no more often than that (`Kube.stream`).

    Never raises `KubeError`; runs until cancelled (or the consumer stops iterating).
    """
    backoff = backoff or Backoff()
    period = kube.watch_timeout_s if timeout_s is None else timeout_s
    pos = _Position(res, namespace, {"label_selector": label_selector,
                                     "field_selector": field_selector}, rewinds or Rewinds(),
                    project, page_size)
    # Only a shared Rewinds can be noticed by someone else mid-wait; a private one
    # spares each event the cancel scope that lets a notice interrupt the wait.
    next_event = pos.rewinds.next if rewinds is not None else _next
    while True:
        received = False
        started = time.monotonic()
        try:
            if await pos.must_relist(kube, reread):
                changes = pos.relist(kube)
                async with aclosing(changes):
                    async for change in changes:
                        yield change
                if listed is not None:
                    listed()
                backoff.reset()
            events = _stream(kube, res, namespace, resource_version=pos.version or None,
                             timeout_s=timeout_s, batch_s=batch_s, **pos.selectors)
            async with aclosing(events):
                while (event := await next_event(events, pos.listed_at)) is not None:
                    received = True
                    backoff.reset()
                    pos.version = resource_version_of(event.object) or pos.version
                    if event.type != BOOKMARK and (news := pos.news(event)) is not None:
                        yield news
            # Cut short, or silent for a whole period (a server that never had our
            # version sends not even a bookmark): ask before resuming.
            pos.doubt = not received or time.monotonic() - started < period - _QUICK_END_S
        except Gone:
            log.info("watch on %s expired at version %s: relisting", res, pos.version)
            pos.version = None
            continue
        except KubeError as exc:
            pos.doubt = True
            delay = backoff.next()
            log.warning("watch on %s failed (%s); retrying in %.1f s", res, exc, delay)
            await anyio.sleep(delay)
            continue
        quick = not received and time.monotonic() - started < _QUICK_END_S
        if quick and pos.rewinds.count == pos.listed_at:
            await anyio.sleep(backoff.next())  # a server ending streams at once: no busy loop
