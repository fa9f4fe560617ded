"""The node health model: is a node's capacity unavailable, how much, and why.

Pure functions of one Node object, shared by lending (what capacity to withhold from
the cohort) and resets (which nodes are EVICT, and the finding codes that say why).

A node's capacity is unavailable when any of these holds (reasons, most telling
first):

    EVICT / ERR / TESTING   the health label, for the verdicts configured to count
                            (WARN and PASS never count): only the resources the
                            health checks judge (`health_resources`, the GPUs),
                            as the AppWrapper operator did: a node with a bad GPU
                            still has its CPUs and memory for CPU work
    NotReady / Unreachable  the node lifecycle controller's taints: the whole node
    Cordoned                `spec.unschedulable`: the whole node

Capacity comes from `status.capacity` or `status.allocatable` (configured); `pods`
is never counted, nor are zero or unparseable quantities.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal

from healthd.capacity.quantities import Quantity, try_quantity
from healthd.kube.conventions import Keys, Verdict
from healthd.kube.objects import is_cordoned, labels_of, name_of, resources_of, taints_of
from healthd.kube.shapes import Node
from healthd.published import Health, read_health

NOT_READY_TAINT = "node.kubernetes.io/not-ready"
UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"
NOT_READY = "NotReady"
UNREACHABLE = "Unreachable"
CORDONED = "Cordoned"
UNCOUNTED_RESOURCES = frozenset({"pods"})
FALLBACK_CODE = Verdict.EVICT.value

# Which reason a node's capacity is reported under when several hold.
REASON_ORDER = (Verdict.EVICT.value, Verdict.ERR.value, Verdict.TESTING.value,
                NOT_READY, UNREACHABLE, CORDONED)
_TAINT_REASONS = {NOT_READY_TAINT: NOT_READY, UNREACHABLE_TAINT: UNREACHABLE}
_COUNTABLE = frozenset({Verdict.ERR, Verdict.TESTING, Verdict.EVICT})  # never WARN or PASS


@dataclass(frozen=True)
class Unavailability:
    """One bad node's contribution: its capacity per resource, why, and its labels
    (which flavors it belongs to)."""

    node: str
    reasons: frozenset[str]
    capacity: Mapping[str, Quantity] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def reason(self) -> str:
        """The one reason metrics report it under (first in REASON_ORDER)."""
        return next((r for r in REASON_ORDER if r in self.reasons), min(self.reasons))


def verdict_of(node: Node, keys: Keys) -> Verdict | None:
    """The published verdict label, or None when absent or not a verdict."""
    try:
        return Verdict(labels_of(node).get(keys.gpuhealth, ""))
    except ValueError:
        return None


def is_evict(node: Node, keys: Keys) -> bool:
    """The node's label says running work must move now."""
    return verdict_of(node, keys) is Verdict.EVICT


def _taint_reasons(node: Node) -> set[str]:
    return {_TAINT_REASONS[str(taint["key"])] for taint in taints_of(node)
            if taint.get("key") in _TAINT_REASONS}


def reasons_of(node: Node, *, keys: Keys,
               bad_verdicts: frozenset[Verdict]) -> frozenset[str]:
    """Every reason the node's capacity is unavailable (empty: it is available)."""
    reasons = _taint_reasons(node)
    verdict = verdict_of(node, keys)
    if verdict is not None and verdict in bad_verdicts and verdict in _COUNTABLE:
        reasons.add(verdict.value)
    if is_cordoned(node):
        reasons.add(CORDONED)
    return frozenset(reasons)


def capacity_of(node: Node, source: str = "capacity") -> dict[str, Quantity]:
    """Non-zero quantities of `status.<source>`, `pods` left out."""
    out: dict[str, Quantity] = {}
    for name, text in resources_of(node, source).items():
        quantity = try_quantity(text)
        if name not in UNCOUNTED_RESOURCES and quantity is not None and quantity > 0:
            out[str(name)] = quantity
    return out


WHOLE_NODE_REASONS = frozenset({NOT_READY, UNREACHABLE, CORDONED})


def unavailability(node: Node, *, keys: Keys, bad_verdicts: frozenset[Verdict],
                   source: str = "capacity",
                   health_resources: frozenset[str] | None = None) -> Unavailability | None:
    """The node's contribution to unavailable capacity, or None when it has none.
    A health verdict alone withholds only `health_resources` (None: everything)."""
    reasons = reasons_of(node, keys=keys, bad_verdicts=bad_verdicts)
    if not reasons:
        return None
    capacity = capacity_of(node, source)
    if health_resources is not None and not reasons & WHOLE_NODE_REASONS:
        capacity = {name: q for name, q in capacity.items() if name in health_resources}
    return Unavailability(node=name_of(node), reasons=reasons, capacity=capacity,
                          labels=labels_of(node))


def gpu_count(node: Node, resource: str, source: str = "capacity") -> Decimal:
    """How many `resource` (GPUs) the node has; 0 for a node without any."""
    return capacity_of(node, source).get(resource, Decimal(0))


def evict_codes(node: Node, keys: Keys) -> tuple[str, ...]:
    """The finding codes that hold the node at EVICT, from its health annotation:
    the EVICT holdings, else every holding, else the top code, else `("EVICT",)`
    (also when the annotation is missing or unreadable)."""
    doc = read_health(node, keys)
    if not isinstance(doc, Health):
        return (FALLBACK_CODE,)
    evict = [h.code for h in doc.held if h.severity == Verdict.EVICT.value]
    for candidates in (evict, [h.code for h in doc.held], [doc.top]):
        found = tuple(dict.fromkeys(c for c in candidates if c))
        if found:
            return found
    return (FALLBACK_CODE,)
