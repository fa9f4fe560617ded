"""Which AppWrappers must be reset, decided from objects alone (pure).

An AppWrapper is due for a reset when it is `Running`, is ours to manage
(`spec.managedBy` absent or the AppWrapper operator's own value), and has a
running, non-terminating pod whose regular containers request or limit a GPU
on a node whose verdict is EVICT. These are the AppWrapper operator's own rules
for its NoExecute reset (init containers and pending pods do not count), so
healthd resets exactly what the operator would, only sooner.

One decision per AppWrapper lists every bad node it touches, so one fault costs
one reset however many of its pods or nodes are bad. Nothing here remembers
anything: the same objects always give the same decision, which is what makes
the controller safe across restarts and leader changes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from healthd.capacity.health import FALLBACK_CODE
from healthd.kube.conventions import APPWRAPPER_LABEL, GPU_RESOURCE, OPERATOR_MANAGER, Reason
from healthd.kube.objects import (
    amounts_of,
    condition_of,
    containers_of,
    is_deleting,
    labels_of,
    name_of,
    namespace_of,
    node_name_of,
    phase_of,
    resource_version_of,
)
from healthd.kube.shapes import AppWrapper, Condition, Pod, part
from healthd.util.times import parse_time

RUNNING = "Running"
RESETTING = "Resetting"
UNHEALTHY = "Unhealthy"
# Reasons this controller writes (defined in kube.conventions.Reason).
NODE_EVICTED = Reason.NODE_EVICTED.value  # the Unhealthy reason and the AppWrapper Event
APPWRAPPER_RESET = Reason.APPWRAPPER_RESET.value  # the Event on each EVICT node
BREAKER_OPEN = Reason.RESET_BREAKER_OPEN.value
BREAKER_CLOSED = Reason.RESET_BREAKER_CLOSED.value
MESSAGE_NODES = 10  # nodes (or AppWrappers) named in a message; the rest are counted


@dataclass(frozen=True)
class ResetDecision:
    """Reset `appwrapper` (`ns/name`): its GPU pods run on `nodes`.

    `codes[i]` names the finding codes that made `nodes[i]` EVICT (comma-separated);
    `phase` and `resource_version` are what the decision was made from.
    """

    appwrapper: str
    nodes: tuple[str, ...]
    codes: tuple[str, ...]
    phase: str
    resource_version: str

    @property
    def namespace(self) -> str:
        return self.appwrapper.partition("/")[0]

    @property
    def name(self) -> str:
        return self.appwrapper.partition("/")[2]

    @property
    def message(self) -> str:
        """The `Unhealthy` condition's message, also the Event's."""
        pairs = list(zip(self.nodes, self.codes, strict=True))
        listed = ", ".join(f"{n} ({c})" for n, c in pairs[:MESSAGE_NODES])
        more = f" and {len(pairs) - MESSAGE_NODES} more" if len(pairs) > MESSAGE_NODES else ""
        return f"Pods of this AppWrapper use GPUs on EVICT nodes: {listed}{more}"


# -- the AppWrapper ------------------------------------------------------------------


def ours(aw: AppWrapper) -> bool:
    """True unless `spec.managedBy` names a controller other than the AppWrapper
    operator (MultiKueue, for one): those AppWrappers are someone else's to reset."""
    managed_by = part(aw.get("spec")).get("managedBy")
    return managed_by in (None, "", OPERATOR_MANAGER)


def eligible(aw: AppWrapper) -> bool:
    """Running, ours, and not being deleted: the AppWrapper-level half of the rule."""
    return phase_of(aw) == RUNNING and ours(aw) and not is_deleting(aw)


def unhealthy_condition(aw: AppWrapper) -> Condition | None:
    return condition_of(aw, UNHEALTHY)


def last_reset_at(aw: AppWrapper) -> float | None:
    """When this controller last reset `aw` (epoch seconds), from its `Unhealthy`
    condition (reason NodeEvicted); None when it never did, as far as the object says."""
    cond = unhealthy_condition(aw)
    if cond is None or cond.get("reason") != NODE_EVICTED:
        return None
    return parse_time(cond.get("lastTransitionTime"))


# -- pods ----------------------------------------------------------------------------


def _nonzero(value: object) -> bool:
    text = str(value).strip()
    try:
        return float(text.rstrip("m") or 0) > 0
    except ValueError:  # an odd quantity that is not a plain number: present, so counted
        return bool(text)


def uses_gpu(pod: Pod, resource: str = GPU_RESOURCE) -> bool:
    """A regular container (init containers do not count) requests or limits a non-zero
    amount of `resource`."""
    return any(_nonzero(amount) for container in containers_of(pod)
               for amount in amounts_of(container, resource))


def counts(pod: Pod, resource: str = GPU_RESOURCE) -> bool:
    """The pod runs (phase Running, not terminating) and uses a GPU."""
    return phase_of(pod) == RUNNING and not is_deleting(pod) and uses_gpu(pod, resource)


def owner_of(pod: Pod) -> str | None:
    """`ns/name` of the AppWrapper that created `pod`, or None."""
    name, ns = labels_of(pod).get(APPWRAPPER_LABEL), namespace_of(pod)
    return f"{ns}/{name}" if name and ns else None


def affected(pods: Iterable[Pod], resource: str = GPU_RESOURCE) -> set[str]:
    """AppWrappers (`ns/name`) with a counting pod among `pods` (e.g. the pods on a
    node that just turned EVICT): the ones to decide about."""
    return {owner for pod in pods if counts(pod, resource) and (owner := owner_of(pod))}


# -- the decision --------------------------------------------------------------------


def decide(aw: AppWrapper, pods: Iterable[Pod],
           evict_nodes: Mapping[str, tuple[str, ...]], *,
           resource: str = GPU_RESOURCE) -> ResetDecision | None:
    """The reset `aw` is due, or None.

    `pods` may be any pods (e.g. the AppWrapper's, or every pod on the EVICT nodes):
    only those of `aw` count. `evict_nodes` maps each EVICT node to its finding codes.
    """
    if not eligible(aw):
        return None
    ns, name = namespace_of(aw), name_of(aw)
    key = f"{ns}/{name}"
    bad: set[str] = set()
    for pod in pods:
        node = node_name_of(pod)
        if node in evict_nodes and owner_of(pod) == key and counts(pod, resource):
            bad.add(node)
    if not bad:
        return None
    nodes = tuple(sorted(bad))
    codes = tuple(", ".join(evict_nodes[n]) or FALLBACK_CODE for n in nodes)
    return ResetDecision(appwrapper=key, nodes=nodes, codes=codes, phase=phase_of(aw),
                         resource_version=resource_version_of(aw) or "")
