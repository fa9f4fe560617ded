"""Decoding the API server's answers when one object in them is nested too deep.

The API server stores whatever a CRD's schema lets through (an AppWrapper's
`components[].template` takes any fields), nested up to 10,000 levels, the Go
decoder's bound. Python's decoder gives up with `RecursionError` near 1,000. One
such object must cost that object only, never the list or the watch it comes in,
so an answer the decoder gives up on is decoded again with every value nested
deeper than `MAX_DEPTH` replaced by `TOO_DEEP`, and the objects that carry it are
taken out (`sift_answer`, `sift_event`): to healthd they do not exist.

- a List: the other items are kept;
- a watch event: ADDED becomes a BOOKMARK (the resume point still moves on),
  MODIFIED becomes DELETED (what the server holds can no longer be read, so a
  cache forgets its old copy rather than act on it; a relist would drop it too),
  DELETED stays DELETED (its metadata is shallow and survives);
- one object (a GET or a write's answer): `Undecodable`, never a lossy copy that
  could be written back.

Each skipped object is named in a warning and counted by kind, once,
in an `UndecodableObjects` tally that the agent's and the controller's metrics
read at scrape time.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from healthd.kube.errors import Undecodable

log = logging.getLogger(__name__)

MAX_DEPTH = 400  # values nested deeper are cut in the second pass (Python's decoder: ~1,000)
TOO_DEEP = "\x00healthd: nested too deep to decode"
_REMEMBERED = 4096  # objects already warned about (relists and updates repeat them)
# A JSON string, or one bracket: what a depth count needs to see.
_TOKENS = re.compile(r'"(?:[^"\\]+|\\.)*"|[\[\]{}]')


def loads(raw: bytes | str) -> tuple[Any, bool]:
    """The JSON value of `raw`, and whether values nested deeper than `MAX_DEPTH`
    were replaced by `TOO_DEEP` (only when the decoder ran out of recursion).
    ValueError for text that is not JSON."""
    try:
        return json.loads(raw), False
    except RecursionError:
        text = raw.decode() if isinstance(raw, bytes) else raw
        pruned, cut = prune(text)
        return json.loads(pruned), cut > 0


def prune(text: str, depth: int = MAX_DEPTH,
          replace: Callable[[str], str] | None = None) -> tuple[str, int]:
    """`text` with every array and object opened deeper than `depth` replaced by
    `replace(its text)` (default: the `TOO_DEEP` string), and how many were."""
    marker = json.dumps(TOO_DEEP)
    pieces: list[str] = []
    level = copied = cut = 0
    start = -1  # where the value being cut opened; -1: none
    for match in _TOKENS.finditer(text):
        token = match.group()
        if token[0] == '"':
            continue
        if token in "[{":
            level += 1
            if level == depth + 1:
                start = match.start()
            continue
        if level == depth + 1 and start >= 0:
            pieces += [text[copied:start], replace(text[start:match.end()]) if replace else marker]
            copied, start, cut = match.end(), -1, cut + 1
        level -= 1
    pieces.append(text[copied:])
    return "".join(pieces), cut


def carries_marker(value: Any) -> bool:
    """Whether `value` holds `TOO_DEEP` anywhere (a walk without recursion)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif item == TOO_DEEP:
            return True
    return False


class UndecodableObjects:
    """The objects skipped as undecodable, counted by kind (the resource's plural);
    each object (by uid) is counted and logged once, however often relists and its
    own updates bring it back."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # a scrape may read from another thread
        self._counts: dict[str, int] = {}
        self._told: OrderedDict[tuple[str, str, str], None] = OrderedDict()

    def skip(self, where: str, kind: str, objects: Iterable[Mapping[str, Any]]) -> None:
        """Count and name the objects of `kind` skipped in the answer to `where`."""
        fresh = [obj for obj in objects if self._first(kind, obj)]
        if not fresh:
            return
        with self._lock:
            self._counts[kind] = self._counts.get(kind, 0) + len(fresh)
        log.warning("%s: skipped %d %s nested deeper than %d levels, which healthd cannot "
                    "decode (everything else is served): %s", where, len(fresh), kind,
                    MAX_DEPTH, ", ".join(_name(obj) for obj in fresh))

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def _first(self, kind: str, obj: Mapping[str, Any]) -> bool:
        meta = _meta(obj)
        key = (kind, _name(obj), str(meta.get("uid") or ""))
        with self._lock:
            if key in self._told:
                return False
            self._told[key] = None
            if len(self._told) > _REMEMBERED:
                self._told.popitem(last=False)
        return True


# This process's tally: what a client counts unless given its own; metrics read it.
UNDECODABLE = UndecodableObjects()


def sift_answer(value: dict[str, Any], where: str, kind: str,
                tally: UndecodableObjects) -> dict[str, Any]:
    """A pruned answer without its undecodable objects: a List keeps its other
    items; one object raises `Undecodable`."""
    items = value.get("items")
    if isinstance(items, list):
        dropped = [item for item in items if carries_marker(item)]
        tally.skip(where, kind, (item for item in dropped if isinstance(item, dict)))
        return {**value, "items": [item for item in items if not carries_marker(item)]}
    if carries_marker(value):
        tally.skip(where, kind, [value])
        raise Undecodable(f"{where}: {_name(value)} is nested deeper than {MAX_DEPTH} "
                          "levels and cannot be decoded")
    return value


def sift_event(line: dict[str, Any], where: str, kind: str,
               tally: UndecodableObjects) -> dict[str, Any]:
    """A pruned watch event as the watch must see it (module docstring)."""
    obj = line.get("object")
    if line.get("type") not in ("ADDED", "MODIFIED", "DELETED") or not carries_marker(obj):
        return line
    assert isinstance(obj, dict)  # carries_marker found a container
    tally.skip(where, kind, [obj])
    if line["type"] == "ADDED":
        version = {"resourceVersion": _meta(obj).get("resourceVersion")}
        return {"type": "BOOKMARK", "object": {"metadata": version}}
    return {"type": "DELETED", "object": obj}


def plural_of(path: str) -> str:
    """The resource named by an API path (`/apis/g/v1/namespaces/ns/things/a` ->
    `things`)."""
    parts = [p for p in path.split("?")[0].split("/") if p]
    rest = parts[2:] if parts[:1] == ["api"] else parts[3:]
    if len(rest) > 2 and rest[0] == "namespaces":
        rest = rest[2:]
    return rest[0] if rest else path


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _name(obj: Mapping[str, Any]) -> str:
    meta = _meta(obj)
    name = str(meta.get("name") or "?")
    return f"{meta['namespace']}/{name}" if meta.get("namespace") else name
