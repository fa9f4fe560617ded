"""What the cluster shows while something happens, recorded as it happens: every value
a watch delivers (a poll could miss one that lasted a moment), and the Events sent.

`Recorder` lists the objects (the baseline), then watches them from the list's
resourceVersion in a thread and keeps, per object, every distinct value that
`extract` gives, in order; `on_event`, when given, sees every object as it comes,
deletions included, to act on it there and then. `published` is what healthd
publishes on a Node (its labels, its annotations, the GPUUnhealthy condition);
`lending_limit` is the slack queue's. `EventLog` tells which Events about some
objects were sent since it began.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from kubernetes import client as k8s
from kubernetes import watch

from tests.e2e.healthd import eventually

Obj = dict[str, Any]
LABEL_PREFIX = "autopilot.ibm.com/"
OWN_PREFIX = "healthd.io/"
# Annotations admins write (requests), not healthd; and ping's peers, which the
# controller rewrites whenever the agent pods' addresses move (a rollout) or the sets
# rotate (every hour): plumbing between healthd's parts, not the node's state.
ADMIN_KEYS = {f"{OWN_PREFIX}run", f"{OWN_PREFIX}run-id", f"{OWN_PREFIX}clear"}
PLUMBING_KEYS = {f"{OWN_PREFIX}peers"}
CONDITION = "GPUUnhealthy"
GPU = "nvidia.com/gpu"


def published(node: Obj) -> Obj:
    """What healthd publishes on `node` (docs/verdicts.md): its labels, its own
    annotations (but ping's peers) and the GPUUnhealthy condition."""
    meta = node.get("metadata") or {}
    conditions = (node.get("status") or {}).get("conditions") or []
    return {
        "labels": {k: v for k, v in (meta.get("labels") or {}).items()
                   if k.startswith(LABEL_PREFIX)},
        "annotations": {k: v for k, v in (meta.get("annotations") or {}).items()
                        if k.startswith(OWN_PREFIX) and k not in ADMIN_KEYS | PLUMBING_KEYS},
        "condition": next((c for c in conditions if c.get("type") == CONDITION), None),
    }


def verdict(shown: Obj) -> str | None:
    """The gpuhealth label of a `published` value."""
    value = shown["labels"].get(f"{LABEL_PREFIX}gpuhealth")
    return None if value is None else str(value)


def condition(shown: Obj) -> tuple[str, str] | None:
    """The GPUUnhealthy condition's status and reason of a `published` value."""
    found = shown["condition"]
    return None if found is None else (found.get("status"), found.get("reason"))


def lending_limit(queue: Obj) -> str | None:
    """The slack ClusterQueue's GPU lendingLimit (None: no limit)."""
    for group in (queue.get("spec") or {}).get("resourceGroups") or []:
        for flavor in group.get("flavors") or []:
            for resource in flavor.get("resources") or []:
                if resource.get("name") == GPU:
                    limit = resource.get("lendingLimit")
                    return None if limit is None else str(limit)
    return None


class Recorder:
    """See the module docstring. `list_call(**kwargs)` lists (and, with `watch=True`,
    watches) the objects; their names key them. `on_event(type, object)` is called,
    in the recorder's thread, for each object listed ("ADDED") or delivered by the
    watch ("ADDED", "MODIFIED", "DELETED"), before it is recorded."""

    def __init__(self, client: k8s.ApiClient, list_call: Callable[..., Any],
                 extract: Callable[[Obj], Any], *, names: Iterable[str] | None = None,
                 on_event: Callable[[str, Obj], None] | None = None, **kwargs: Any) -> None:
        self._client, self._list, self._extract, self._kwargs = client, list_call, extract, kwargs
        self._on_event = on_event or (lambda kind, obj: None)
        self._names = None if names is None else set(names)
        self.history: dict[str, list[Any]] = {}
        self.seen_at: dict[str, list[float]] = {}  # when each value arrived (time.time())
        self.order: list[str] = []  # the objects by when each was first seen
        self.relists = 0  # lists after the first (410 Gone): a value may have been missed
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._watch = watch.Watch()
        self._version = self._relist()
        self._thread = threading.Thread(target=self._run, name="recorder", daemon=True)
        self._thread.start()

    def _as_dict(self, obj: Any) -> Obj:
        return dict(self._client.sanitize_for_serialization(obj))

    def _record(self, obj: Obj) -> None:
        name = obj["metadata"]["name"]
        if self._names is not None and name not in self._names:
            return
        value = self._extract(obj)
        with self._lock:
            if name not in self.history:
                self.order.append(name)
            seen = self.history.setdefault(name, [])
            if not seen or seen[-1] != value:
                seen.append(value)
                self.seen_at.setdefault(name, []).append(time.time())

    def _relist(self) -> str:
        listing = self._as_dict(self._list(**self._kwargs))
        for item in listing.get("items") or []:
            self._on_event("ADDED", item)
            self._record(item)
        return str(listing["metadata"]["resourceVersion"])

    def _run(self) -> None:
        while not self._done.is_set():
            try:
                for event in self._watch.stream(self._list, resource_version=self._version,
                                                timeout_seconds=5, **self._kwargs):
                    if event["type"] == "ERROR":
                        raise k8s.ApiException(status=event["raw_object"].get("code"))
                    obj = self._as_dict(event["object"])
                    self._on_event(event["type"], obj)
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self._record(obj)
                    self._version = obj["metadata"].get("resourceVersion") or self._version
                    if self._done.is_set():
                        return
            except k8s.ApiException as exc:
                if exc.status != 410:
                    self._done.wait(1.0)
                    continue
                with contextlib.suppress(Exception):
                    self.relists += 1
                    self._version = self._relist()
            except Exception:  # a dropped connection: resume where it stopped
                self._done.wait(1.0)

    def values(self, name: str) -> list[Any]:
        with self._lock:
            return list(self.history.get(name, []))

    def timed(self, name: str) -> list[tuple[Any, float]]:
        """Each value with when it arrived here."""
        with self._lock:
            return list(zip(self.history.get(name, []), self.seen_at.get(name, []),
                            strict=True))

    def stop(self, current: dict[str, Any] | None = None, timeout_s: float = 30) -> None:
        """Stop watching; first, with `current` (name -> the value a fresh read
        gives), wait until the watch has delivered it."""
        if current:
            eventually(lambda: all(self.values(n)[-1:] == [v] for n, v in current.items()),
                       timeout_s, "the watch caught up with a fresh read")
        self._done.set()
        self._watch.stop()


def event_marks(core: k8s.CoreV1Api, kind: str, names: Iterable[str]) -> dict[str, str]:
    """Every Event about the `kind` objects `names`, keyed by what changes when an Event
    is sent (a new Event, or an old one counted again): its description."""
    wanted = set(names)
    out = {}
    for event in core.list_event_for_all_namespaces(
            field_selector=f"involvedObject.kind={kind}").items:
        involved = event.involved_object
        if involved.name not in wanted:
            continue
        series = event.series.count if event.series else None
        mark = f"{event.metadata.uid}/{event.count}/{series}/{event.last_timestamp}"
        out[mark] = f"{kind} {involved.name}: {event.type} {event.reason}: {event.message}"
    return out


class EventLog:
    """The Events about some Nodes and ClusterQueues sent since it was made."""

    def __init__(self, core: k8s.CoreV1Api, nodes: Iterable[str], queues: Iterable[str]) -> None:
        self.core, self.nodes, self.queues = core, list(nodes), list(queues)
        self.before = self._marks()

    def _marks(self) -> dict[str, str]:
        return {**event_marks(self.core, "Node", self.nodes),
                **event_marks(self.core, "ClusterQueue", self.queues)}

    def sent(self) -> list[str]:
        return sorted(text for mark, text in self._marks().items() if mark not in self.before)
