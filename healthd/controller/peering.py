"""Ping's peers, published: the controller watches the agent pods once and writes each
node's bounded peer set on its Node (annotation `healthd.io/peers`), where that
node's agent already looks (it watches its own Node). So no agent lists or watches
the other agents: one watch of N pods here instead of N watches of N pods, and each
agent probes `count` peers per network instead of N - 1 (healthd.blame.peersets says
who probes whom, and why every node is probed by exactly `count` others).

Writes: only a Node whose annotation differs from what it should be is patched (a
merge patch of that one key, so nothing else of the Node is touched; the admission
policy in deploy/ lets the controller change no other key). In steady state within an
epoch there are none: a rotation (every `rotate_every`, 1 h by default) rewrites
every node's set once, an agent pod that comes, goes or changes address rewrites
the `count` sets that name it (plus its own), and a node without a live agent has
its annotation removed. Writes go one at a time, so a rotation of 10,000 nodes
takes the API server's pace rather than a burst. Changes are coalesced for
`settle_s` (a DaemonSet rollout replaces pods one after another).

The sets also carry the fleet's blame back to the nodes that probe a blamed node
(`set_blame`, from healthd.blame.announce after every judgement): such a peer is
marked blamed on its network, and that node's `ping` leaves it out of its isolation
count (checks.ping). A blame that starts or ends rewrites the `count` sets that name
the node there. The first write of a term waits for the term's first judgement, so a
new leader never strips the blame its predecessor published, only to put it back.

The agent pods are kept projected to what a peer set needs (node, addresses,
networks, liveness, creation time), not as whole objects.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

import anyio

from healthd.blame.agents import is_live, member_of
from healthd.blame.network_status import ProblemLog, network_status
from healthd.blame.peersets import Blame, Member, epoch_of, peer_sets
from healthd.config.controller import PeerSetSettings
from healthd.controller.caches import NODES_KIND
from healthd.kube import Backoff, Kube, KubeError, NotFound, WatchEvent, watch_forever
from healthd.kube.conventions import Keys
from healthd.kube.objects import NODES, PODS, key_of, meta, name_of, node_name_of
from healthd.kube.shapes import KubeObject, Node, Pod, view
from healthd.kube.watching import DELETED, Rewinds

log = logging.getLogger(__name__)

SETTLE_S = 1.0


class NodeStore(Protocol):
    def get(self, key: str) -> Node | None: ...

    def values(self) -> Iterable[Node]: ...


class NodeCache(Protocol):
    """What peering reads of the controller's caches: the nodes, once synced."""

    @property
    def nodes(self) -> NodeStore: ...

    async def wait_synced(self, kinds: Iterable[str] | None = None) -> None: ...


@dataclass(frozen=True)
class _AgentPod:
    """What a peer set needs of one agent pod."""

    node: str
    created: str
    member: Member | None  # None: not live (not running, terminating, no IP)


class AgentPods:
    """The agent pods by key, projected as they arrive; `synced` once the first list
    is in. `members()`: one per node, its newest live pod's."""

    kind = "agent pods"

    def __init__(self) -> None:
        self.synced = anyio.Event()
        self._pods: dict[str, _AgentPod] = {}
        self._problems = ProblemLog()

    def __len__(self) -> int:
        return len(self._pods)

    def apply(self, event: WatchEvent) -> bool:
        """Fold one event in; whether what peers see of it changed."""
        pod = view(Pod, event.object)
        key = key_of(pod)
        if event.type == DELETED:
            return self._pods.pop(key, None) is not None
        self._problems.note(key, network_status(pod))
        slim = _AgentPod(node_name_of(pod), str(meta(pod).get("creationTimestamp") or ""),
                         member_of(pod) if is_live(pod) else None)
        if self._pods.get(key) == slim:
            return False
        self._pods[key] = slim
        return True

    def members(self) -> list[Member]:
        newest: dict[str, _AgentPod] = {}
        for pod in self._pods.values():
            held = newest.get(pod.node)
            if pod.member is not None and (held is None or pod.created > held.created):
                newest[pod.node] = pod
        return [p.member for p in newest.values() if p.member is not None]


class PeerPublisher:
    """Keeps every Node's `healthd.io/peers` equal to its peer set; see the module
    docstring. `handle` is the caches' change callback; `run` watches the agent pods
    and writes until cancelled."""

    def __init__(self, kube: Kube, caches: NodeCache, *, settings: PeerSetSettings,
                 namespace: str, label_selector: str, keys: Keys, dry_run: bool,
                 clock: Callable[[], float], rewinds: Rewinds | None = None,
                 settle_s: float = SETTLE_S) -> None:
        self._kube = kube
        self._caches = caches
        self._settings = settings
        self._namespace = namespace
        self._selector = label_selector
        self._keys = keys
        self._dry_run = dry_run
        self._clock = clock
        self._rewinds = rewinds
        self.settle_s = settle_s
        self.pods = AgentPods()
        self.writes = 0  # Node patches sent (or, in dry run, that would have been)
        self._changed = anyio.Event()
        self._blamed: frozenset[Blame] = frozenset()
        self._judged = anyio.Event()  # the fleet's blame was handed over at least once

    def set_blame(self, blamed: frozenset[Blame]) -> None:
        """The (node, network) pairs the fleet blames now; the sets that name one of
        them there are rewritten when it moves."""
        if blamed != self._blamed:
            self._blamed = blamed
            self._changed.set()
        self._judged.set()

    def handle(self, kind: str, old: KubeObject | None, new: KubeObject | None) -> None:
        """A Node came, went, or its annotation moved (someone else's write, or ours
        coming back): look again. Heartbeats change nothing here."""
        if kind != NODES_KIND:
            return
        if old is None or new is None or self._annotation(old) != self._annotation(new):
            self._changed.set()

    async def run(self) -> None:
        async with anyio.create_task_group() as group:
            group.start_soon(self._watch)
            await self._caches.wait_synced([NODES_KIND])
            await self.pods.synced.wait()
            await self._judged.wait()
            await self._publish()

    async def _watch(self) -> None:
        async for event in watch_forever(self._kube, PODS, self._namespace,
                                         label_selector=self._selector,
                                         rewinds=self._rewinds, listed=self.pods.synced.set):
            if self.pods.apply(event):
                self._changed.set()

    async def _publish(self) -> None:
        """Reconcile, then again on every change or at the next rotation."""
        backoff = Backoff(initial=1, maximum=60)
        epoch_s = self._settings.rotate_every
        while True:
            self._changed = anyio.Event()
            failed = await self.reconcile()
            wait = epoch_s - self._clock() % epoch_s
            if failed:
                wait = min(wait, backoff.next())
            else:
                backoff.reset()
            with anyio.move_on_after(wait):
                await self._changed.wait()
                await anyio.sleep(self.settle_s)

    def desired(self) -> dict[str, str | None]:
        """node -> the annotation it should carry (None: none), for every cached Node."""
        nodes = {name_of(n) for n in self._caches.nodes.values()}
        members = [m for m in self.pods.members() if m.node in nodes]
        epoch = epoch_of(self._clock(), self._settings.rotate_every)
        sets = peer_sets(members, self._settings.count, epoch, self._blamed)
        return {node: (sets[node].encode() if node in sets else None) for node in sorted(nodes)}

    async def reconcile(self) -> int:
        """Patch every Node whose annotation is not what it should be; the number of
        writes that failed (retried later)."""
        failed = 0
        for node, want in self.desired().items():
            current = self._caches.nodes.get(node)
            if current is None or self._annotation(current) == want:
                continue
            failed += not await self._write(node, want)
        return failed

    async def _write(self, node: str, value: str | None) -> bool:
        self.writes += 1
        if self._dry_run:
            log.debug("dry run: would set %s on node %s", self._keys.peers, node)
            return True
        patch = {"metadata": {"annotations": {self._keys.peers: value}}}
        try:
            await self._kube.merge_patch(NODES, node, patch)
        except NotFound:
            return True  # gone: nothing to publish
        except KubeError as exc:
            log.warning("cannot publish the ping peers of node %s (%s); retrying", node, exc,
                        extra={"node": node})
            return False
        return True

    def _annotation(self, node: KubeObject) -> str | None:
        value = (meta(node).get("annotations") or {}).get(self._keys.peers)
        return value if isinstance(value, str) else None
