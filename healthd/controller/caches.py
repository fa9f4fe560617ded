"""The controller's view of the cluster: in-memory stores fed by list+watch.

One `Store` per kind (Nodes, AppWrapper pods, AppWrappers, the slack ClusterQueues,
ResourceFlavors), each fed by its own `healthd.kube.watch_forever` loop, so the
controller never polls: it resumes watches on resourceVersion, relists on 410 (the
relist's synthetic DELETED events keep the stores exact) and waits out outages.
The loops share one `Rewinds`: when the server's history moved back (etcd restored
from a backup), noticed by any of them or by the Lease (healthd.controller.election),
every store relists at once, and the differences reach `on_change` as events.
Every change reaches `on_change(kind, old, new)` as it is applied, which is what lets
the controller react to a label change in well under a second.

Each store keeps its objects projected (healthd.kube.projections: a Node, a pod, an
AppWrapper cut down to the fields the controller reads, the queues and flavors
without managedFields), projected as they arrive, before anything holds them, and
with their repeated keys and values shared across the store once stored. An
event that changes nothing the projection keeps (a Node heartbeat) is dropped by the
watch: no store write, no `on_change`. Lists come in pages.

The Node watch is read a quarter second's worth at a time (`NODE_BATCH_S`,
healthd.kube.client `Kube.stream`): thousands of heartbeating nodes then cost one
wake-up per batch rather than one per heartbeat, which is most of what an idle
controller spends; a label change reaches the handlers at most that much later.

A store is `synced` once its first full list has been applied; nothing may be
written before the caches it decides from are synced (a half-filled node cache would
make a healthy-looking cluster and wipe a valid lendingLimit).

Kueue serves `v1beta2` (`cohortName`) or `v1beta1` (`cohort`); the caches discover
which through `/apis/kueue.x-k8s.io` and prefer v1beta2.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Generic

import anyio

from healthd.controller.resets import owner_of
from healthd.kube import Backoff, Kube, KubeError, NotFound, WatchEvent, watch_forever
from healthd.kube.conventions import APPWRAPPER_LABEL, Keys
from healthd.kube.kueue import KUEUE_GROUP, KueueResources, choose_kueue
from healthd.kube.objects import (
    APPWRAPPERS,
    NODES,
    PODS,
    Resource,
    key_of,
    name_of,
    node_name_of,
    resource_version_of,
    slim,
)
from healthd.kube.projections import (
    APPWRAPPER_FIELDS,
    POD_FIELDS,
    Projection,
    node_fields,
    projection,
    share,
    without_managed_fields,
)
from healthd.kube.shapes import (
    APIGroup,
    AppWrapper,
    ClusterQueue,
    KubeObject,
    Node,
    Pod,
    ResourceFlavor,
    T,
    view,
)
from healthd.kube.watching import DELETED, Rewinds

log = logging.getLogger(__name__)

# The kinds, as passed to `on_change` and accepted by `wait_synced`.
NODES_KIND = NODES.plural
PODS_KIND = PODS.plural
APPWRAPPERS_KIND = "appwrappers"
QUEUES_KIND = "clusterqueues"
FLAVORS_KIND = "resourceflavors"
KINDS = (NODES_KIND, PODS_KIND, APPWRAPPERS_KIND, QUEUES_KIND, FLAVORS_KIND)
RESET_KINDS = (NODES_KIND, PODS_KIND, APPWRAPPERS_KIND)  # what resets decide from
LENDING_KINDS = (NODES_KIND, QUEUES_KIND, FLAVORS_KIND)  # what lending decides from
# Node events are read this many seconds' worth at a time (module docstring).
NODE_BATCH_S = 0.25

Obj = KubeObject  # any kind's object, as `on_change` gets it
OnChange = Callable[[str, Obj | None, Obj | None], None]


class Store(Generic[T]):
    """One kind's objects by `ns/name` (or `name`), kept current by watch events, each
    seen as `shape` (healthd.kube.shapes): where the watched JSON becomes typed.

    `accept` filters what is kept (an object that stops matching is dropped as if
    deleted); `synced` is set once the first full list has been applied.
    """

    def __init__(self, kind: str, shape: type[T],
                 accept: Callable[[T], bool] | None = None) -> None:
        self.kind = kind
        self.shape = shape
        self.synced = anyio.Event()
        self._objects: dict[str, T] = {}
        self._accept = accept

    def apply(self, event: WatchEvent) -> tuple[T | None, T | None]:
        """Apply one event; returns (old, new), new None when the object is gone."""
        obj = slim(view(self.shape, event.object))
        key = key_of(obj)
        if event.type == DELETED or (self._accept and not self._accept(obj)):
            return self._objects.pop(key, None), None
        old = self._objects.get(key)
        self._objects[key] = share(obj)
        return old, obj

    def get(self, key: str) -> T | None:
        return self._objects.get(key)

    def values(self) -> Iterable[T]:
        return self._objects.values()

    def keys(self) -> Iterable[str]:
        return self._objects.keys()

    def __len__(self) -> int:
        return len(self._objects)

    def __contains__(self, key: object) -> bool:
        return key in self._objects


class _Index:
    """Keys of pods grouped by one derived value (by node, by AppWrapper)."""

    def __init__(self, value_of: Callable[[Pod], str | None]) -> None:
        self._value_of = value_of
        self._groups: dict[str, dict[str, None]] = {}  # dicts keep insertion order

    def update(self, old: Pod | None, new: Pod | None) -> None:
        before = self._value_of(old) if old is not None else None
        after = self._value_of(new) if new is not None else None
        key = key_of(new if new is not None else old or {})
        if before is not None and before != after:
            group = self._groups.get(before, {})
            group.pop(key, None)
            if not group:
                self._groups.pop(before, None)
        if after is not None:
            self._groups.setdefault(after, {})[key] = None

    def keys(self, value: str) -> Iterator[str]:
        return iter(list(self._groups.get(value, ())))


def _node_name(pod: Pod) -> str | None:
    return node_name_of(pod) or None


class Caches:
    """The five stores, their watch loops, and the indexes the controller needs.

    `on_change(kind, old, new)` runs synchronously after each applied change
    (including the first list); it must be quick and must not raise (errors are
    logged and dropped so a faulty handler cannot stop a cache).
    """

    def __init__(self, kube: Kube, *, slack_queues: Sequence[str],
                 on_change: OnChange | None = None, backoff: Backoff | None = None,
                 rewinds: Rewinds | None = None, keys: Keys | None = None) -> None:
        self._kube = kube
        self._on_change = on_change
        self._backoff = backoff or Backoff(initial=1, maximum=60)
        self.rewinds = rewinds or Rewinds()
        self.slack_queues = frozenset(slack_queues)
        self.nodes = Store(NODES_KIND, Node)
        self.pods = Store(PODS_KIND, Pod, accept=lambda pod: owner_of(pod) is not None)
        self.appwrappers = Store(APPWRAPPERS_KIND, AppWrapper)
        self.clusterqueues = Store(QUEUES_KIND, ClusterQueue,
                                   accept=lambda q: name_of(q) in self.slack_queues)
        self.flavors = Store(FLAVORS_KIND, ResourceFlavor)
        self.kueue: KueueResources | None = None
        self._by_kind = {s.kind: s for s in self._stores()}
        self._by_node = _Index(_node_name)
        self._by_appwrapper = _Index(owner_of)
        self._projections: dict[str, Projection] = {
            NODES_KIND: projection(node_fields(keys or Keys())),
            PODS_KIND: projection(POD_FIELDS),
            APPWRAPPERS_KIND: projection(APPWRAPPER_FIELDS),
            QUEUES_KIND: without_managed_fields,
            FLAVORS_KIND: without_managed_fields,
        }

    def store(self, kind: str) -> Store[Any]:
        """The store of `kind` (one of KINDS)."""
        return self._by_kind[kind]

    def _stores(self) -> tuple[Store[Any], ...]:
        return (self.nodes, self.pods, self.appwrappers, self.clusterqueues, self.flavors)

    # -- indexes -------------------------------------------------------------------

    def pods_on_node(self, node: str) -> list[Pod]:
        """AppWrapper pods bound to `node` (by `spec.nodeName`)."""
        return self._lookup(self._by_node.keys(node))

    def pods_of_appwrapper(self, key: str) -> list[Pod]:
        """Pods labelled for the AppWrapper `ns/name`, in its namespace."""
        return self._lookup(self._by_appwrapper.keys(key))

    def _lookup(self, keys: Iterable[str]) -> list[Pod]:
        return [pod for key in keys if (pod := self.pods.get(key)) is not None]

    # -- sync ----------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        return all(s.synced.is_set() for s in self._stores())

    async def wait_synced(self, kinds: Iterable[str] | None = None) -> None:
        """Until every store (or those of `kinds`) holds its first full list."""
        for kind in kinds if kinds is not None else KINDS:
            await self.store(kind).synced.wait()

    # -- feeding -------------------------------------------------------------------

    def apply(self, kind: str, event: WatchEvent) -> tuple[Obj | None, Obj | None]:
        """Apply one event to a store and its indexes, then call `on_change` (unless
        nothing changed). Public so tests and replays can feed events directly."""
        old, new = self.store(kind).apply(event)
        if kind == PODS_KIND:
            self._by_node.update(old, new)
            self._by_appwrapper.update(old, new)
        if old is None and new is None:
            return old, new
        if old is not None and new is not None and _same_version(old, new):
            return old, new
        self._notify(kind, old, new)
        return old, new

    def _notify(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        if self._on_change is None:
            return
        try:
            self._on_change(kind, old, new)
        except Exception:  # a faulty handler must not stop the cache
            log.exception("change handler failed on %s %s", kind, key_of(new or old or {}))

    async def run(self) -> None:
        """Discover Kueue, then watch every kind until cancelled. Never raises KubeError."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._watch, NODES_KIND, NODES, None)
            tg.start_soon(self._watch, PODS_KIND, PODS, APPWRAPPER_LABEL)
            tg.start_soon(self._watch, APPWRAPPERS_KIND, APPWRAPPERS, None)
            self.kueue = await self._discover_kueue()
            tg.start_soon(self._watch, QUEUES_KIND, self.kueue.queues, None)
            tg.start_soon(self._watch, FLAVORS_KIND, self.kueue.flavors, None)

    async def _watch(self, kind: str, res: Resource, label_selector: str | None) -> None:
        store = self.store(kind)

        def listed() -> None:  # every listed object is applied by now
            if not store.synced.is_set():
                store.synced.set()
                log.info("cache of %s synced: %d objects", kind, len(store))

        events = watch_forever(self._kube, res, label_selector=label_selector,
                               rewinds=self.rewinds, project=self._projections[kind],
                               listed=listed,
                               batch_s=NODE_BATCH_S if kind == NODES_KIND else 0)
        async for event in events:
            self.apply(kind, event)

    async def _discover_kueue(self) -> KueueResources:
        """The Kueue version to use; waits (with backoff, quietly after the first
        message) while the server does not serve Kueue at all."""
        backoff = Backoff(initial=1, maximum=60)
        told = False
        while True:
            try:
                group = await self._kube.request("GET", f"/apis/{KUEUE_GROUP}")
                chosen = choose_kueue(view(APIGroup, group))
                if chosen is not None:
                    log.info("using Kueue %s", chosen.queues.api_version)
                    return chosen
                problem = "serves neither kueue.x-k8s.io/v1beta2 nor v1beta1"
            except NotFound:
                problem = "does not serve kueue.x-k8s.io (Kueue not installed?)"
            except KubeError as exc:
                problem = f"cannot discover Kueue: {exc}"
            (log.debug if told else log.warning)("the API server %s; lending waits", problem)
            told = True
            await anyio.sleep(backoff.next())


def _same_version(old: Obj, new: Obj) -> bool:
    rv = resource_version_of(new)
    return rv is not None and rv == resource_version_of(old)
