"""The object store: objects, the global resourceVersion and the event history.

The store owns every rule about how an object changes: what create fills in, what an
update may not touch (system metadata; `.status` through the main resource and
everything but `.status` through `/status`), optimistic concurrency on
`metadata.resourceVersion`, finalizers, and the bounded history that watches replay
from. It is synchronous and guarded by one lock, so tests may call it from any
thread; watchers on the event loop are woken through `call_soon_threadsafe`.

Objects are kept in the storage shape (see `resources`) without apiVersion/kind;
callers pass and receive the shape of the resource version they speak.

`snapshot` and `restore` are etcd's backup and restore as an API server behind it
shows them: every object and the revision go back to the snapshot's, open watches
are cut off (the restore restarts the API server), the history starts empty at the
snapshot's revision (watches from before it get 410), and new writes continue from
that revision, so the versions clients last saw come round again with other content.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import random
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field

from healthd.sim.apiserver.errors import ApiError
from healthd.sim.apiserver.patching import apply_patch
from healthd.sim.apiserver.resources import (
    RESOURCES,
    Obj,
    ResourceType,
    copy_json,
    from_version,
    to_version,
)
from healthd.sim.apiserver.selectors import Selector
from healthd.sim.apiserver.validation import (
    annotation_errors,
    check_event_time,
    event_errors,
    refuse,
)
from healthd.util.times import rfc3339

_SYSTEM_METADATA = ("uid", "creationTimestamp", "deletionTimestamp",
                    "deletionGracePeriodSeconds", "generation", "namespace", "name")
_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # the real server's generateName alphabet

Key = tuple[str, str]  # (namespace or "", name)


def now_text() -> str:
    return rfc3339(time.time())


def _meta(obj: Obj) -> Obj:
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        meta = obj["metadata"] = {}
    return meta


def validate(rt: ResourceType, obj: Obj, *, creating: bool) -> None:
    """The real server's rules that product writes can meet (see `validation`)."""
    errors = annotation_errors(obj)
    if rt.storage_key == "events":
        check_event_time(rt, obj)
        errors += event_errors(rt, obj, creating=creating)
    refuse(rt, obj, errors)


def _selected(stored: Obj, rt: ResourceType, selector: Selector | None) -> bool:
    """Whether the selector takes a stored object (judged as served where the served
    version renames fields, else before any copy is made)."""
    if selector is None:
        return True
    return selector.matches(render(stored, rt) if rt.renames else stored)


def render(obj: Obj, rt: ResourceType) -> Obj:
    """A copy of a stored object as `rt` serves it."""
    return to_version(copy_json(obj), rt)


@dataclass
class StoreEvent:
    """One change: the state after it (for DELETED, the last state) and before it."""

    type: str
    rv: int
    storage: str
    obj: Obj
    prev: Obj | None = None


class Expired(Exception):
    """A watch asked for a resourceVersion older than the history holds."""


@dataclass(frozen=True)
class Page:
    """Where the next page of a paginated list starts: the list's revision and the
    last key served (what the real server's continue token holds)."""

    rv: int
    last: Key


@dataclass(frozen=True)
class Snapshot:
    """The store as a backup of etcd holds it: every object, and the revision."""

    objects: dict[str, dict[Key, Obj]]
    rv: int


def _copy_objects(objects: dict[str, dict[Key, Obj]]) -> dict[str, dict[Key, Obj]]:
    return {storage: {key: copy_json(obj) for key, obj in bucket.items()}
            for storage, bucket in objects.items()}


@dataclass(eq=False)
class _VersionWaiter:
    """A request waiting for the store to reach a revision."""

    rv: int
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[None]

    def wake(self) -> None:
        def done() -> None:
            if not self.future.done():
                self.future.set_result(None)

        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            self.loop.call_soon_threadsafe(done)


@dataclass(eq=False)
class Subscription:
    """A live watch: raw store events for one storage, delivered on one loop."""

    storage: str
    loop: asyncio.AbstractEventLoop
    start_rv: int
    # A watch from a version newer than the server's own (a restored or replaced
    # server): nothing at or below it is sent, not even a BOOKMARK.
    silent_until: int = 0
    queue: asyncio.Queue[StoreEvent | None] = field(default_factory=asyncio.Queue)

    def push(self, event: StoreEvent | None) -> None:
        # RuntimeError: the loop is closed, nobody is listening any more.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.queue.put_nowait, event)


class Store:
    """All objects of every resource, one resourceVersion counter, one history."""

    def __init__(self, history_limit: int = 1000) -> None:
        self._lock = threading.RLock()
        self._objects: dict[str, dict[Key, Obj]] = {}
        self._rv = 0
        self._history: deque[StoreEvent] = deque()
        self._history_limit = history_limit
        self._floor = 0  # every event with rv > floor is still in the history
        self._subs: set[Subscription] = set()
        self._waiters: set[_VersionWaiter] = set()

    @property
    def resource_version(self) -> int:
        with self._lock:
            return self._rv

    # -- reads ---------------------------------------------------------------------

    def _bucket(self, rt: ResourceType) -> dict[Key, Obj]:
        return self._objects.setdefault(rt.storage_key, {})

    def _current(self, rt: ResourceType, namespace: str, name: str) -> Obj:
        obj = self._bucket(rt).get((namespace if rt.namespaced else "", name))
        if obj is None:
            raise ApiError.not_found(rt.plural, name, rt.group)
        return obj

    def get(self, rt: ResourceType, namespace: str, name: str) -> Obj:
        with self._lock:
            return render(self._current(rt, namespace, name), rt)

    def list(self, rt: ResourceType, namespace: str | None,
             selector: Selector | None = None) -> tuple[list[Obj], int]:
        """Matching objects as `rt` serves them (sorted by namespace/name), and the rv."""
        with self._lock:
            stored = [obj for key, obj in sorted(self._bucket(rt).items())
                      if namespace is None or key[0] == namespace]
            if selector is not None and not rt.renames:
                # Select before copying: a selective list of a large collection (a
                # controller's pods) copies only what it returns.
                stored = [obj for obj in stored if selector.matches(obj)]
                selector = None
            items = [render(obj, rt) for obj in stored]
            return [o for o in items if selector is None or selector.matches(o)], self._rv

    def page(self, rt: ResourceType, namespace: str | None, selector: Selector | None,
             limit: int, after: Page | None = None
             ) -> tuple[builtins.list[Obj], Page | None, int]:
        """One page of a paginated list, as etcd-backed lists serve them: at most
        `limit` matching objects in key order, from the revision of the first page
        (`after`, from the previous page's continue token) so the pages add up to one
        consistent list; the next page's start when more keys follow, and how many.
        A revision the history no longer reaches (compacted) is `Expired`."""
        with self._lock:
            rv = self._rv if after is None else after.rv
            bucket = self._bucket(rt) if rv == self._rv else self._bucket_at(rt, rv)
            keys = sorted(k for k in bucket if (namespace is None or k[0] == namespace)
                          and (after is None or k > after.last))
            items: builtins.list[Obj] = []
            for index, key in enumerate(keys):
                if _selected(bucket[key], rt, selector):
                    items.append(render(bucket[key], rt))
                if len(items) == limit:
                    rest = len(keys) - index - 1
                    return items, (Page(rv, key) if rest else None), rest
            return items, None, 0

    def _bucket_at(self, rt: ResourceType, rv: int) -> dict[Key, Obj]:
        """The objects of `rt` as they were at revision `rv`: today's, with every
        later change in the history undone."""
        if rv < self._floor:
            raise Expired(f"too old resource version: {rv} ({self._floor})")
        bucket = dict(self._bucket(rt))
        for event in reversed(self._history):
            if event.rv <= rv:
                break
            if event.storage != rt.storage_key:
                continue
            meta = event.obj["metadata"]
            key = (meta.get("namespace", "") if rt.namespaced else "", meta["name"])
            if event.prev is None:
                bucket.pop(key, None)
            else:
                bucket[key] = event.prev
        return bucket

    # -- the one write path --------------------------------------------------------

    def _commit(self, rt: ResourceType, kind: str, obj: Obj, prev: Obj | None) -> Obj:
        self._rv += 1
        _meta(obj)["resourceVersion"] = str(self._rv)
        meta = obj["metadata"]
        key = (meta.get("namespace", "") if rt.namespaced else "", meta["name"])
        if kind == "DELETED":
            self._bucket(rt).pop(key, None)
        else:
            self._bucket(rt)[key] = obj
        event = StoreEvent(kind, self._rv, rt.storage_key, copy_json(obj),
                           copy_json(prev))
        if len(self._history) >= self._history_limit:
            self._floor = self._history.popleft().rv
        self._history.append(event)
        for sub in list(self._subs):
            if sub.storage == event.storage:
                sub.push(event)
        for waiter in [w for w in self._waiters if w.rv <= self._rv]:
            self._waiters.discard(waiter)
            waiter.wake()
        return copy_json(obj)

    async def reached(self, rv: int, timeout: float) -> bool:
        """Whether the store's revision is `rv` or later, waiting up to `timeout` s."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._rv >= rv:
                return True
            waiter = _VersionWaiter(rv, loop, loop.create_future())
            self._waiters.add(waiter)
        try:
            await asyncio.wait_for(waiter.future, timeout)
            return True
        except TimeoutError:
            return False
        finally:
            with self._lock:
                self._waiters.discard(waiter)

    # -- create --------------------------------------------------------------------

    def _name_for(self, rt: ResourceType, namespace: str, meta: Obj) -> str:
        if meta.get("name"):
            return str(meta["name"])
        prefix = str(meta.get("generateName") or "")
        if not prefix:
            raise ApiError.invalid(f"{rt.kind} is invalid: metadata.name: Required value: "
                                   "name or generateName is required")
        for _ in range(100):
            name = prefix + "".join(random.choices(_NAME_ALPHABET, k=5))
            if (namespace, name) not in self._bucket(rt):
                return name
        raise ApiError(500, "could not generate a unique name")

    def create(self, rt: ResourceType, namespace: str, body: Obj) -> Obj:
        """POST: fills in uid, timestamps, generation, name from generateName."""
        obj = from_version(copy_json(body), rt)
        meta = _meta(obj)
        namespace = namespace if rt.namespaced else ""
        if rt.namespaced and meta.get("namespace") not in (None, "", namespace):
            raise ApiError.bad_request("the namespace of the provided object does not match "
                                       "the namespace sent on the request")
        if meta.get("resourceVersion"):
            raise ApiError(500, "resourceVersion should not be set on objects to be created")
        with self._lock:
            meta["name"] = self._name_for(rt, namespace, meta)
            if (namespace, meta["name"]) in self._bucket(rt):
                raise ApiError.already_exists(rt.plural, meta["name"], rt.group)
            for key in ("deletionTimestamp", "deletionGracePeriodSeconds"):
                meta.pop(key, None)
            self._fill_new_metadata(meta, namespace if rt.namespaced else None)
            validate(rt, obj, creating=True)
            if rt.status and not rt.keeps_status_on_create:
                obj.pop("status", None)
                if rt.initial_status is not None:
                    obj["status"] = copy_json(rt.initial_status)
            return render(self._commit(rt, "ADDED", obj, None), rt)

    @staticmethod
    def _fill_new_metadata(meta: Obj, namespace: str | None) -> None:
        meta["uid"] = meta.get("uid") or str(uuid.uuid4())
        meta["creationTimestamp"] = meta.get("creationTimestamp") or now_text()
        meta.setdefault("generation", 1)
        if namespace is not None:
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)

    # -- update (PUT and PATCH) ----------------------------------------------------

    def replace(self, rt: ResourceType, namespace: str, name: str, body: Obj, *,
                subresource: str = "") -> Obj:
        """PUT on the object or on its `/status`."""
        with self._lock:
            old = self._current(rt, namespace, name)
            return self._update(rt, old, from_version(copy_json(body), rt), subresource)

    def patch(self, rt: ResourceType, namespace: str, name: str, content_type: str,
              patch: object, *, subresource: str = "") -> Obj:
        """PATCH on the object or on its `/status`, in any of the supported flavours."""
        with self._lock:
            old = self._current(rt, namespace, name)
            patched = apply_patch(render(old, rt), content_type, patch, custom=rt.is_custom)
            return self._update(rt, old, from_version(patched, rt), subresource)

    def _update(self, rt: ResourceType, old: Obj, new: Obj, subresource: str) -> Obj:
        old_meta, new_meta = old["metadata"], _meta(new)
        if new_meta.get("name") not in (None, old_meta["name"]):
            raise ApiError.bad_request("the name of the object does not match the name on "
                                       "the URL")
        sent_rv = new_meta.get("resourceVersion")
        if sent_rv and str(sent_rv) != old_meta["resourceVersion"]:
            raise ApiError.conflict(rt.plural, old_meta["name"], rt.group)
        if subresource == "status":
            new = self._only_status(old, new)
        else:
            self._keep_system_fields(rt, old, new)
        new["metadata"]["resourceVersion"] = old_meta["resourceVersion"]
        validate(rt, new, creating=False)
        if new == old:  # the real server skips writes that change nothing
            return render(old, rt)
        if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
            return render(self._commit(rt, "DELETED", new, old), rt)
        return render(self._commit(rt, "MODIFIED", new, old), rt)

    @staticmethod
    def _only_status(old: Obj, new: Obj) -> Obj:
        out = copy_json(old)
        if "status" in new:
            out["status"] = new["status"]
        else:
            out.pop("status", None)
        return out

    @staticmethod
    def _keep_system_fields(rt: ResourceType, old: Obj, new: Obj) -> None:
        new_meta = new["metadata"]
        for key in _SYSTEM_METADATA:
            if key in old["metadata"]:
                new_meta[key] = old["metadata"][key]
            else:
                new_meta.pop(key, None)
        if rt.status:
            if "status" in old:
                new["status"] = copy_json(old["status"])
            else:
                new.pop("status", None)
        body_of = {k: v for k, v in new.items() if k not in ("metadata", "status")}
        if body_of != {k: v for k, v in old.items() if k not in ("metadata", "status")}:
            new_meta["generation"] = int(old["metadata"].get("generation", 1)) + 1

    # -- delete --------------------------------------------------------------------

    def delete(self, rt: ResourceType, namespace: str, name: str,
               preconditions: Obj | None = None) -> tuple[Obj, bool]:
        """DELETE: (the object, whether it is gone). Finalizers postpone the removal."""
        with self._lock:
            old = self._current(rt, namespace, name)
            self._check_preconditions(rt, old, preconditions or {})
            if rt.kind == "Namespace" and not rt.namespaced:
                self._empty_namespace(name)
            if old["metadata"].get("finalizers"):
                if old["metadata"].get("deletionTimestamp"):
                    return render(old, rt), False
                new = copy_json(old)
                new["metadata"]["deletionTimestamp"] = now_text()
                new["metadata"]["deletionGracePeriodSeconds"] = 0
                return render(self._commit(rt, "MODIFIED", new, old), rt), False
            return render(self._commit(rt, "DELETED", copy_json(old), old), rt), True

    @staticmethod
    def _check_preconditions(rt: ResourceType, old: Obj, pre: Obj) -> None:
        meta = old["metadata"]
        for key in ("uid", "resourceVersion"):
            if pre.get(key) and str(pre[key]) != meta.get(key):
                raise ApiError(409, f"Precondition failed: {key}: {pre[key]}, object has "
                               f"{meta.get(key)}", "Conflict",
                               {"name": meta["name"], "group": rt.group, "kind": rt.plural})

    def _empty_namespace(self, namespace: str) -> None:
        seen: set[str] = set()
        for rt in RESOURCES:
            if not rt.namespaced or rt.storage_key in seen:
                continue
            seen.add(rt.storage_key)
            for key in [k for k in self._bucket(rt) if k[0] == namespace]:
                self.delete(rt, namespace, key[1])

    # -- direct access for tests ---------------------------------------------------

    def put(self, rt: ResourceType, body: Obj) -> Obj:
        """Create or overwrite an object as given, status included (no API rules)."""
        obj = from_version(copy_json(body), rt)
        meta = _meta(obj)
        namespace = (meta.get("namespace") or "default") if rt.namespaced else ""
        with self._lock:
            meta["name"] = self._name_for(rt, namespace, meta)
            old = self._bucket(rt).get((namespace, meta["name"]))
            if old is not None:
                for key in ("uid", "creationTimestamp"):
                    meta.setdefault(key, old["metadata"].get(key))
            self._fill_new_metadata(meta, namespace if rt.namespaced else None)
            kind = "ADDED" if old is None else "MODIFIED"
            return render(self._commit(rt, kind, obj, old), rt)

    def remove(self, rt: ResourceType, namespace: str, name: str) -> None:
        """Remove an object at once, finalizers or not (a DELETED event still goes out)."""
        with self._lock:
            old = self._current(rt, namespace, name)
            self._commit(rt, "DELETED", copy_json(old), old)

    def compact(self) -> None:
        """Forget the history, like etcd compaction: older watches get 410 Expired."""
        with self._lock:
            self._history.clear()
            self._floor = self._rv

    def snapshot(self) -> Snapshot:
        """What a backup of etcd would hold now (see the module docstring)."""
        with self._lock:
            return Snapshot(_copy_objects(self._objects), self._rv)

    def restore(self, snapshot: Snapshot) -> None:
        """Go back to `snapshot` as etcd restored from it would (module docstring)."""
        with self._lock:
            self._objects = _copy_objects(snapshot.objects)
            self._rv = snapshot.rv
            self._history.clear()
            self._floor = snapshot.rv
        self.drop_watches()

    # -- watch ---------------------------------------------------------------------

    def subscribe(self, rt: ResourceType, namespace: str | None, since: str | None,
                  loop: asyncio.AbstractEventLoop
                  ) -> tuple[Subscription, builtins.list[StoreEvent]]:
        """Register a watcher; return it with the events it must see first."""
        with self._lock:
            silent_until = 0
            if since in (None, "", "0"):
                initial = [StoreEvent("ADDED", int(o["metadata"]["resourceVersion"]),
                                      rt.storage_key, copy_json(o))
                           for key, o in sorted(self._bucket(rt).items())
                           if namespace is None or key[0] == namespace]
            else:
                try:
                    start = int(str(since))
                except ValueError as exc:
                    raise ApiError.bad_request(f"invalid resourceVersion {since!r}") from exc
                if start < self._floor:
                    raise Expired(f"too old resource version: {start} ({self._floor})")
                initial = [e for e in self._history
                           if e.rv > start and e.storage == rt.storage_key]
                # A version from another server (a restored etcd) is accepted as the
                # real server does: a silent stream until that version comes.
                silent_until = start if start > self._rv else 0
            sub = Subscription(rt.storage_key, loop, self._rv, silent_until=silent_until)
            self._subs.add(sub)
            return sub, initial

    def unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            self._subs.discard(sub)

    def drop_watches(self) -> None:
        """End every open watch (the server is going away)."""
        with self._lock:
            subs, self._subs = self._subs, set()
        for sub in subs:
            sub.push(None)
