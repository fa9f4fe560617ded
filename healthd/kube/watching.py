"""Watching collections: one watch request, and the endless list-watch loop.

`watch` is one `watch=true` request: a stream of ADDED/MODIFIED/DELETED events
from a resourceVersion, ended by the server's `timeoutSeconds`. BOOKMARKs only move
the resume point and are not yielded; an expired resourceVersion raises `Gone`.

`watch_forever` is what every cache and loop in healthd uses (no polling anywhere):
list, then watch from the list's resourceVersion, resume from the last version
seen whenever a stream ends or breaks, relist when the version expired (410) or
the server never had it (after a silent watch, a one-item list asks) and
turn the difference into events (ADDED and MODIFIED for what is there, DELETED for
what vanished meanwhile), and wait with backoff and jitter while the server is
unreachable. It never raises `KubeError` and runs until cancelled.

Usage::

    async for event in watch_forever(kube, NODES, field_selector=f"metadata.name={node}"):
        handle(event.type, event.object)
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator, Iterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import anyio

from healthd.kube.backoff import Backoff
from healthd.kube.client import Kube, Query
from healthd.kube.errors import Gone, KubeError, from_status_object
from healthd.kube.objects import Resource, key_of, resource_version_of

log = logging.getLogger(__name__)

ADDED = "ADDED"
MODIFIED = "MODIFIED"
DELETED = "DELETED"
BOOKMARK = "BOOKMARK"
_KINDS = frozenset({ADDED, MODIFIED, DELETED, BOOKMARK})
_QUICK_END_S = 1.0  # a stream that ends this fast with nothing in it earns a backoff


@dataclass(frozen=True)
class WatchEvent:
    """One change: `type` is ADDED, MODIFIED or DELETED; `object` the object as sent."""

    type: str
    object: dict[str, Any]


async def _stream(kube: Kube, res: Resource, namespace: str | None, *,
                  label_selector: str | None, field_selector: str | None,
                  resource_version: str | None, timeout_s: int | None
                  ) -> AsyncGenerator[WatchEvent, None]:
    """One watch request, BOOKMARKs included; ERROR events raise their error. A
    stream silent past its timeout plus the client's margin is a dead connection."""
    timeout_s = kube.watch_timeout_s if timeout_s is None else timeout_s
    query = {"watch": True, "allowWatchBookmarks": True, "timeoutSeconds": timeout_s,
             "labelSelector": label_selector, "fieldSelector": field_selector,
             "resourceVersion": resource_version}
    lines = kube.stream(res.path(namespace), query=query,
                        read_timeout_s=timeout_s + kube.watch_read_margin_s)
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


def _relist(known: dict[str, dict[str, Any]], items: list[dict[str, Any]]
            ) -> Iterator[WatchEvent]:
    """Events that turn `known` into `items` (and update `known` to match)."""
    fresh = {key_of(obj): obj for obj in items if isinstance(obj, dict)}
    for key in [k for k in known if k not in fresh]:
        yield WatchEvent(DELETED, known.pop(key))
    for key, obj in fresh.items():
        before = known.get(key)
        known[key] = obj
        if before is None:
            yield WatchEvent(ADDED, obj)
        elif resource_version_of(before) != resource_version_of(obj):
            yield WatchEvent(MODIFIED, obj)


async def _known_version(kube: Kube, res: Resource, namespace: str | None, version: str,
                         selectors: dict[str, str | None]) -> None:
    """`Gone` unless the server has reached `version`. A watch from a version the
    server never had (a restored or replaced server: versions started again) is
    accepted and stays silent, so after a silent watch a one-item list from that
    version asks; the server refuses a version it has not reached (504 TooLarge)."""
    query: Query = {"resourceVersion": version, "resourceVersionMatch": "NotOlderThan",
                    "limit": 1, "labelSelector": selectors["label_selector"],
                    "fieldSelector": selectors["field_selector"]}
    await kube.request("GET", res.path(namespace), query=query)


def _remember(known: dict[str, dict[str, Any]], event: WatchEvent) -> None:
    if event.type == DELETED:
        known.pop(key_of(event.object), None)
    else:
        known[key_of(event.object)] = event.object


async def watch_forever(kube: Kube, res: Resource, namespace: str | None = None, *,
                        label_selector: str | None = None, field_selector: str | None = None,
                        backoff: Backoff | None = None,
                        timeout_s: int | None = None) -> AsyncGenerator[WatchEvent, None]:
    """List, then watch and resume forever; relist on 410 or a version the server
    never had; back off while unreachable.

    Never raises `KubeError`; runs until cancelled (or the consumer stops iterating).
    """
    backoff = backoff or Backoff()
    known: dict[str, dict[str, Any]] = {}
    version: str | None = None
    selectors = {"label_selector": label_selector, "field_selector": field_selector}
    while True:
        received = False
        started = time.monotonic()
        try:
            if version is None:
                listing = await kube.list(res, namespace, **selectors)
                version = resource_version_of(listing) or ""
                backoff.reset()
                for event in _relist(known, list(listing.get("items") or [])):
                    yield event
            events = _stream(kube, res, namespace, resource_version=version or None,
                             timeout_s=timeout_s, **selectors)
            async with aclosing(events):
                async for event in events:
                    received = True
                    backoff.reset()
                    version = resource_version_of(event.object) or version
                    if event.type != BOOKMARK:
                        _remember(known, event)
                        yield event
            if not received and version and time.monotonic() - started >= _QUICK_END_S:
                await _known_version(kube, res, namespace, version, selectors)
        except Gone:
            log.info("watch on %s expired at version %s: relisting", res, version)
            version = None
            continue
        except KubeError as exc:
            delay = backoff.next()
            log.warning("watch on %s failed (%s); retrying in %.1f s", res, exc, delay)
            await anyio.sleep(delay)
            continue
        if not received and time.monotonic() - started < _QUICK_END_S:
            await anyio.sleep(backoff.next())  # a server ending streams at once: no busy loop
