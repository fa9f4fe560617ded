"""The agent's own Node as its watch (`metadata.name=<node>` only) shows it: the
latest copy, a signal that it has been seen at all, and a wake-up for whoever waits
for its next change (on-demand requests)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import anyio

from healthd.kube.client import Kube
from healthd.kube.objects import NODES
from healthd.kube.watching import watch_forever

log = logging.getLogger(__name__)

Obj = dict[str, Any]  # a Kubernetes object as JSON


class NodeWatch:
    """Follows Node `node`; `on_node` gets every new copy before waiters wake."""

    def __init__(self, node: str, on_node: Callable[[Obj], None]) -> None:
        self.node = node
        self.obj: Obj | None = None  # the node as last seen
        self.seen = anyio.Event()  # set at the first copy
        self._on_node = on_node
        self._changed = anyio.Event()

    async def run(self, kube: Kube) -> None:
        """Watch until cancelled (watch_forever reconnects)."""
        # `reread`: one small list per watch period compares the Node's content with
        # the copy last seen, whatever its version (a restored etcd; see watching).
        async for event in watch_forever(kube, NODES, reread=True,
                                         field_selector=f"metadata.name={self.node}"):
            if event.type == "DELETED":
                log.warning("node %s was deleted; waiting for it to come back", self.node)
                continue
            self.obj = event.object
            self._on_node(event.object)
            self.seen.set()
            self._changed.set()

    async def next(self) -> Obj | None:
        """Wait for the next copy (or one not yet consumed); the node as seen."""
        await self._changed.wait()
        self._changed = anyio.Event()
        return self.obj
