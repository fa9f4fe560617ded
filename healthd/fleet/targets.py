"""Which nodes a fleet command acts on, and whether their GPUs are busy.

An admin names nodes three ways: a label selector, a list of names, or an
AppWrapper (`NAMESPACE/NAME`) whose pods' nodes are the targets. `resolve` turns
any of them into the Node objects as listed now (their verdict before anything is
asked) plus the names that match no node. `busy_nodes` answers "which of these
nodes have pods holding GPUs", the gate in front of exclusive diagnostics, with
the agent's own rule (healthd.kube.pods).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import anyio

from healthd.kube.client import Kube
from healthd.kube.conventions import APPWRAPPER_LABEL, Keys
from healthd.kube.errors import KubeError, NotFound
from healthd.kube.objects import APPWRAPPERS, NODES, PODS, items_of, name_of, node_name_of
from healthd.kube.pods import gpu_pods
from healthd.kube.shapes import Node, Pod

BUSY_CHECKS_AT_ONCE = 16  # pod listings in flight while checking many nodes


class TargetError(ValueError):
    """The targets cannot be resolved (bad `--job`, an AppWrapper without pods)."""


@dataclass(frozen=True)
class Targets:
    """What the admin asked for: exactly one of the three is set."""

    selector: str | None = None
    names: tuple[str, ...] = ()
    job: str | None = None

    @classmethod
    def from_args(cls, *, selector: str | None, nodes: str | None, job: str | None,
                  namespace: str | None = None) -> Targets:
        """From the command line's `--selector`, `--nodes n1,n2`, `--job ns/name` (or
        `--job name` in `namespace`, kubectl's `-n`; "default" without one)."""
        if nodes is not None:
            names = tuple(dict.fromkeys(n.strip() for n in nodes.split(",") if n.strip()))
            if not names:
                raise TargetError(f"--nodes {nodes!r} names no node: write e.g. n1,n2")
            return cls(names=names)
        if job is not None:
            if "/" not in job:
                job = f"{namespace or 'default'}/{job}"
            elif namespace is not None and not job.startswith(f"{namespace}/"):
                raise TargetError(f"--job {job!r} names another namespace than -n {namespace}")
            job_namespace, _, name = job.partition("/")
            if not job_namespace or not name or "/" in name:
                raise TargetError(f"--job {job!r}: expected [NAMESPACE/]APPWRAPPER")
            return cls(job=job)
        return cls(selector=selector or "")

    def describe(self) -> str:
        if self.names:
            return f"nodes {', '.join(self.names)}"
        if self.job:
            return f"the nodes of AppWrapper {self.job}"
        return f"nodes matching {self.selector!r}" if self.selector else "every node"


@dataclass
class Resolved:
    """The target nodes as listed (in a stable order) and names that match no node."""

    nodes: dict[str, Node] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    label_selector: str | None = None  # what a watch over the targets may filter on
    field_selector: str | None = None


async def resolve(kube: Kube, targets: Targets) -> Resolved:
    """List the target nodes. KubeError when the API cannot say; TargetError for a
    `--job` that names no AppWrapper or one without pods on nodes."""
    if targets.job:
        names = await job_nodes(kube, targets.job)
        return await _by_name(kube, names)
    if targets.names:
        return await _by_name(kube, list(targets.names))
    selector = targets.selector or None
    listed = await kube.list(NODES, label_selector=selector)
    nodes = {name_of(n): n for n in items_of(listed, Node) if name_of(n)}
    return Resolved(dict(sorted(nodes.items())), [], label_selector=selector)


async def _by_name(kube: Kube, names: Sequence[str]) -> Resolved:
    if len(names) == 1:  # one node: a listing (and later a watch) of that node only
        selector = f"metadata.name={names[0]}"
        listed = await kube.list(NODES, field_selector=selector)
    else:
        selector = None
        listed = await kube.list(NODES)
    present = {name_of(n): n for n in items_of(listed, Node)}
    nodes = {n: present[n] for n in names if n in present}
    return Resolved(nodes, [n for n in names if n not in present], field_selector=selector)


async def job_nodes(kube: Kube, job: str) -> list[str]:
    """The nodes the AppWrapper `namespace/name`'s pods are bound to, sorted."""
    namespace, _, name = job.partition("/")
    try:
        await kube.get(APPWRAPPERS, name, namespace)
    except NotFound:
        raise TargetError(f"no AppWrapper {job}") from None
    pods = await kube.list(PODS, namespace, label_selector=f"{APPWRAPPER_LABEL}={name}")
    nodes = sorted({node_name_of(p) for p in items_of(pods, Pod) if node_name_of(p)})
    if not nodes:
        raise TargetError(f"AppWrapper {job} has no pod bound to a node (not running?)")
    return nodes


async def busy_nodes(kube: Kube, keys: Keys, nodes: Iterable[str]) -> dict[str, str]:
    """node -> why an exclusive check must not start there: the pods holding its
    GPUs, or why that cannot be told. Nodes whose GPUs are free are left out."""
    limiter = anyio.CapacityLimiter(BUSY_CHECKS_AT_ONCE)
    out: dict[str, str] = {}

    async def one(node: str) -> None:
        async with limiter:
            try:
                holders = await gpu_pods(kube, node, keys)
            except KubeError as exc:
                out[node] = f"cannot tell whether the GPUs are free: {exc}"
                return
        if holders:
            out[node] = f"GPUs busy: held by {', '.join(holders)}"

    async with anyio.create_task_group() as group:
        for node in nodes:
            group.start_soon(one, node)
    return out
