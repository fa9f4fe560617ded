"""Slack lending: what each slack ClusterQueue's `lendingLimit` should be.

For every resource group, flavor and resource of a queue::

    unavailable  = sum of the capacity of bad nodes whose labels match the flavor's
                   `nodeLabels` (empty nodeLabels match every node)
    lendingLimit = max(0, nominalQuota - unavailable), and no field at all when
                   nothing is unavailable
    shortfall    = max(0, unavailable - nominalQuota): what the clamp hides

`LendingModel` is incremental so a 10,000-node fleet costs milliseconds: each bad
node's contribution is stored, and per-(flavor, resource) sums move by the delta
when one node changes (O(flavors) per node event); only a change of the flavors
themselves, which is rare, rebuilds the sums. `changes(queue)` then reads the sums
for what the queue lists. Pure: no I/O, no clock.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal

from healthd.capacity.health import Unavailability
from healthd.capacity.quantities import format_quantity, parse_quantity, try_quantity
from healthd.kube.objects import name_of
from healthd.kube.shapes import ClusterQueue, FlavorQuotas, ResourceQuota, entries, part

__all__ = ["LendingModel", "LimitChange", "flavor_path", "format_quantity", "lending_path",
           "parse_quantity"]

log = logging.getLogger(__name__)

ZERO = Decimal(0)
Sums = defaultdict[str, Decimal]
ReasonSums = defaultdict[tuple[str, str], Decimal]


def flavor_path(group: int, flavor: int) -> str:
    """The JSON pointer of one flavor of one resource group in a ClusterQueue."""
    return f"/spec/resourceGroups/{group}/flavors/{flavor}"


def lending_path(group: int, flavor: int, resource: int, leaf: str = "lendingLimit") -> str:
    """The JSON pointer of one resource's field in a ClusterQueue."""
    return f"{flavor_path(group, flavor)}/resources/{resource}/{leaf}"


@dataclass(frozen=True)
class LimitChange:
    """One (group, flavor, resource) of a queue: the value read and the value due.

    `old`/`new` are quantity strings, None for "no lendingLimit". `group`, `flavor`
    and `resource` index the queue's lists as read (`path` points there); `flavor`
    in the name field is the flavor's name.
    """

    queue: str
    group: int
    flavor: str
    resource: str
    path: str
    old: str | None
    new: str | None
    nominal: str
    unavailable: Decimal
    shortfall: Decimal
    flavor_index: int = 0
    resource_index: int = 0

    @property
    def changed(self) -> bool:
        """A write is due: the value read is not the value wanted."""
        if self.old is None or self.new is None:
            return self.old != self.new
        old = try_quantity(self.old)
        return old is None or old != parse_quantity(self.new)


def _matches(labels: Mapping[str, str], selector: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


class LendingModel:
    """Unavailable capacity per flavor and resource, kept up to date by node deltas."""

    def __init__(self) -> None:
        self._nodes: dict[str, Unavailability] = {}
        self._flavors: dict[str, dict[str, str]] = {}
        self._sums: dict[str, Sums] = {}  # flavor -> resource -> unavailable
        self._by_reason: dict[str, ReasonSums] = {}  # flavor -> (resource, reason) -> amount

    # -- inputs --------------------------------------------------------------------

    def set_node(self, name: str, unavail: Unavailability | None) -> None:
        """Replace node `name`'s contribution (None: it has none, or is gone)."""
        old = self._nodes.pop(name, None)
        if old is not None:
            self._add(old, -1)
        if unavail is not None:
            self._nodes[name] = unavail
            self._add(unavail, +1)

    def set_flavors(self, flavors: Mapping[str, Mapping[str, str]]) -> None:
        """The known flavors and their nodeLabels; a change rebuilds the sums."""
        fresh = {name: dict(labels) for name, labels in flavors.items()}
        if fresh == self._flavors:
            return
        self._flavors = fresh
        self._sums = {name: defaultdict(Decimal) for name in fresh}
        self._by_reason = {name: defaultdict(Decimal) for name in fresh}
        for unavail in self._nodes.values():
            self._add(unavail, +1)

    def _add(self, unavail: Unavailability, sign: int) -> None:
        reason = unavail.reason
        for flavor, selector in self._flavors.items():
            if not _matches(unavail.labels, selector):
                continue
            sums, by_reason = self._sums[flavor], self._by_reason[flavor]
            for resource, amount in unavail.capacity.items():
                sums[resource] += sign * amount
                by_reason[(resource, reason)] += sign * amount

    # -- reading -------------------------------------------------------------------

    @property
    def bad_nodes(self) -> Mapping[str, Unavailability]:
        return self._nodes

    def nodes_behind(self, flavor: str, resource: str) -> list[str]:
        """The bad nodes that withhold `resource` in `flavor`, sorted (for messages)."""
        selector = self._flavors.get(flavor)
        if selector is None:
            return []
        return sorted(u.node for u in self._nodes.values()
                      if resource in u.capacity and _matches(u.labels, selector))

    def unavailable(self, flavor: str, resource: str) -> Decimal:
        sums = self._sums.get(flavor)
        return sums.get(resource, ZERO) if sums is not None else ZERO

    def unavailable_by_reason(self, flavor: str) -> dict[tuple[str, str], Decimal]:
        """(resource, reason) -> unavailable capacity in `flavor` (non-zero only)."""
        sums = self._by_reason.get(flavor)
        return {k: v for k, v in sums.items() if v} if sums is not None else {}

    def evaluate(self, queue: ClusterQueue) -> list[LimitChange]:
        """Every (group, flavor, resource) of `queue` whose flavor is known, with the
        value read and the value due (changed or not)."""
        name = name_of(queue)
        out: list[LimitChange] = []
        for g, group in enumerate(entries(part(queue.get("spec")).get("resourceGroups"))):
            for f, flavor in enumerate(entries(group.get("flavors"))):
                out.extend(self._flavor_limits(name, g, f, flavor))
        return out

    def changes(self, queue: ClusterQueue) -> list[LimitChange]:
        """What to write for `queue`: only the entries whose value must change."""
        return [c for c in self.evaluate(queue) if c.changed]

    def _flavor_limits(self, queue: str, g: int, f: int,
                       flavor: FlavorQuotas) -> Iterable[LimitChange]:
        flavor_name = str(flavor.get("name") or "")
        if flavor_name not in self._flavors:
            log.debug("queue %s: flavor %r is not a known ResourceFlavor; left alone",
                      queue, flavor_name)
            return
        for r, entry in enumerate(entries(flavor.get("resources"))):
            nominal = try_quantity(entry.get("nominalQuota"))
            if nominal is None:
                log.debug("queue %s: %s has no usable nominalQuota", queue, entry.get("name"))
                continue
            yield self._limit(queue, (g, f, r), flavor_name, entry, nominal)

    def _limit(self, queue: str, where: tuple[int, int, int], flavor: str,
               entry: ResourceQuota, nominal: Decimal) -> LimitChange:
        resource = str(entry.get("name") or "")
        unavailable = self.unavailable(flavor, resource)
        nominal_text = str(entry.get("nominalQuota"))
        new = None
        if unavailable > 0:
            new = format_quantity(max(ZERO, nominal - unavailable), nominal_text)
        old = entry.get("lendingLimit")
        g, f, r = where
        return LimitChange(
            queue=queue, group=g, flavor=flavor, resource=resource,
            path=lending_path(g, f, r), old=None if old is None else str(old), new=new,
            nominal=nominal_text, unavailable=unavailable,
            shortfall=max(ZERO, unavailable - nominal), flavor_index=f, resource_index=r)
