"""The real API server for the benchmarks (`--api real`): etcd, kube-apiserver,
kube-controller-manager, kube-scheduler and kwok from `tests/realcluster` (built from
their pinned Go modules and cached; the first build takes long), on loopback.

- `control_plane(root)`: that control plane with Kueue's and the AppWrapper
  operator's CRDs but neither program: the benchmarks seed AppWrappers `Running` as
  the operator would leave them, and no operator acts on the resets, so what is timed
  is healthd and the API server alone. kwok plays the nodes (Ready, heartbeats: its
  own stage every 20-45 s, or `--heartbeat lease`, a kubelet's: the Lease renewed,
  the status reported every 5 minutes), with 16 workers per kind instead of its 4.
- `seed(kube, objects)`: creates what `reset_cluster.cluster` yields, a few dozen
  requests at a time; nodes get kwok's annotation, AppWrappers and pods their status
  through the status subresource (a create ignores it): pods Running and Ready as
  kwok would make them, written here because kwok's 4 or 16 workers rendering its
  templates took over 10 minutes for 20,000 pods on a busy 2-core machine (kwok is
  told to leave such pods alone).
- `serve_real`: the child process of `reset_cluster.ProcessCluster` for
  label_to_reset: starts the control plane, seeds it, watches AppWrappers and
  healthd's Events (a real server has no request log: a reset is the watch event that
  shows phase `Resetting`, timed when it arrives here) and labels nodes EVICT through
  the API, as their agents would.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import logging
import os
import re
import signal
import ssl
import sys
import tempfile
import time
import traceback
import urllib.request
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import anyio
from anyio.from_thread import BlockingPortal, start_blocking_portal
from common import REPO
from reset_cluster import NAMESPACES as TEAMS
from reset_cluster import WRITTEN_BY, ResetLog, answer, cluster, namespace, node, rss_mib

from healthd.kube.client import Kube
from healthd.kube.conventions import CONTROLLER_COMPONENT
from healthd.kube.errors import KubeError, Unavailable
from healthd.kube.objects import (
    APPWRAPPERS,
    CLUSTERQUEUES_V1BETA2,
    EVENTS,
    NAMESPACES,
    NODES,
    PODS,
    RESOURCEFLAVORS_V1BETA2,
    name_of,
)
from healthd.kube.watching import ADDED, watch_forever

log = logging.getLogger("bench.real_api")
Obj = dict[str, Any]
KWOK_NODE = {"kwok.x-k8s.io/node": "fake"}  # the annotation the harness's kwok manages
PARALLEL = 32  # requests in flight while seeding or labelling
NOT_READY = "node.kubernetes.io/not-ready"
SETTLE_WAIT_S = 1800.0  # kwok may take this long to run every pod on a loaded machine
RESOURCES = {"Node": NODES, "Pod": PODS, "AppWrapper": APPWRAPPERS,
             "Namespace": NAMESPACES, "ResourceFlavor": RESOURCEFLAVORS_V1BETA2,
             "ClusterQueue": CLUSTERQUEUES_V1BETA2}
BENCH_NAMESPACES = [*(namespace(j) for j in range(TEAMS)), "healthd-system"]
TRANSIENT = {429, 500, 503, 504}
HEARTBEATS = ("kwok", "lease")  # kwok's status stage, or a kubelet's Lease and reports
KWOK_WORKERS = 16  # kwok's workers per kind: its 4 wait on a busy server, not on CPU
# The Leases are renewed every 100 s instead of a kubelet's 10: nothing the benchmark
# measures reads them (the node lifecycle controller waits 10 minutes here), and
# 5,000 nodes renewing every 10 s would keep a core of this machine busy.
NODE_LEASE_S = 400
# Each kubelet-like status report after a delay drawn from 150-450 s, 300 on average
# as a kubelet's: nodes that kwok brought up within a minute report spread over the
# 5 minutes, as a fleet's kubelets started at different times do, from 150 s on.
KUBELET_REPORT_MS = (150_000, 450_000)
POD_IPS = ipaddress.ip_network("10.244.0.0/16")  # the harness's kwok --cidr
NODE_IP = "10.0.0.1"  # and its --node-ip


# -- the control plane ----------------------------------------------------------------

def control_plane(root: Path, *, with_addons: bool = False) -> Any:
    """A `tests.realcluster` ControlPlane in `root`, without Kueue and the operator
    unless `with_addons` (started by `.start()`; without them, then `install_crds`)."""
    return _harness().ControlPlane(root, with_addons=with_addons,
                                   kwok_parallelism=KWOK_WORKERS,
                                   kubelet_report_ms=KUBELET_REPORT_MS,
                                   node_lease_s=NODE_LEASE_S)


def use_harness() -> None:
    """Make the test harness (`tests.realcluster`, `tests.e2e`) importable."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))  # the harness lives with the tests
    _whole_kubernetes_client()


def _harness() -> Any:
    """`tests.realcluster.cluster`, imported on first use."""
    use_harness()
    from tests.realcluster import cluster
    return cluster


def _whole_kubernetes_client() -> None:
    """healthd.kube imports the official client narrowly, its package `__init__`s
    deferred (healthd.kube.narrow) until a name they define is asked for; the harness
    uses the dynamic client, which imports `kubernetes.__version__`: run them now
    (a name the package does not hold runs its deferred `__init__`)."""
    import kubernetes
    getattr(kubernetes, "_the_whole_package", None)


def install_crds(plane: Any) -> None:
    """Kueue's and the AppWrapper operator's CRDs, from the pinned module downloads."""
    from tests.realcluster import addons
    from tests.realcluster.apply import Applier, api_client
    applier = Applier(api_client(plane.admin_kubeconfig))
    definitions = addons.crds()
    applier.apply(definitions)
    applier.wait_established(d["metadata"]["name"] for d in definitions)


@contextlib.contextmanager
def running_plane(root: Path, *, operator: Obj | None = None) -> Iterator[Any]:
    """The control plane up (with the CRDs) for the `with` block; stopped after it,
    also on SIGTERM. With `operator` (its `appwrapper.autopilot` settings) Kueue and
    the AppWrapper operator run too, the operator so configured."""
    plane = control_plane(root, with_addons=operator is not None)
    previous = signal.signal(signal.SIGTERM, _exit_on_term)
    try:
        if operator is not None:
            from tests.realcluster import addons
            plane.appwrapper_config = addons.appwrapper_config(**operator)
        plane.start()
        if operator is None:
            install_crds(plane)
        yield plane
    finally:
        plane.stop()
        signal.signal(signal.SIGTERM, previous)


def _exit_on_term(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # runs the finally blocks that stop the programs


def usage(pids: Iterable[int]) -> dict[str, float]:
    """CPU seconds (user + system) and RSS (MiB) of the processes, summed (/proc)."""
    ticks = os.sysconf("SC_CLK_TCK")
    cpu, rss = 0.0, 0.0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            cpu += (int(fields[11]) + int(fields[12])) / ticks
            rss += rss_mib(pid)
    return {"cpu_s": round(cpu, 3), "rss_mib": round(rss, 1)}


# -- writing many objects -------------------------------------------------------------

async def in_parallel(items: Iterable[Any], work: Callable[[Any], Awaitable[None]],
                      parallel: int = PARALLEL) -> None:
    """`work(item)` for every item, `parallel` at a time."""
    shared = iter(items)  # the workers take turns on one iterator

    async def worker() -> None:
        for item in shared:
            await work(item)

    async with anyio.create_task_group() as group:
        for _ in range(parallel):
            group.start_soon(worker)


async def retried(call: Callable[[], Awaitable[Obj]], attempts: int = 8) -> Obj | None:
    """`call()`, again after a pause when the server is busy; None when the object
    exists already (a create repeated)."""
    for attempt in range(attempts):
        try:
            return await call()
        except KubeError as exc:
            if exc.status == 409:
                return None
            busy = isinstance(exc, Unavailable) or exc.status in TRANSIENT
            if not busy or attempt == attempts - 1:
                raise
            await anyio.sleep(0.5 * (attempt + 1))
    return None


def for_kwok(objects: Iterable[Obj], heartbeat: str = "kwok") -> Iterator[Obj]:
    """The objects as the cluster holds them: nodes kwok manages (Ready, heartbeats of
    the kind `heartbeat` names), pods Running and Ready on them as kwok would make
    them (the status written by `create`, kwok told to leave them alone)."""
    harness = _harness()
    ips = POD_IPS.hosts()
    for obj in objects:
        annotations = obj["metadata"].setdefault("annotations", {})
        if obj["kind"] == "Node":
            annotations.update(KWOK_NODE)
            if heartbeat == "lease":
                annotations.update([harness.KUBELET_HEARTBEAT])
            obj["metadata"]["labels"]["type"] = "kwok"
        elif obj["kind"] == "Pod":
            annotations.update([harness.STATUS_WRITTEN])
            obj["status"] = running(obj, str(next(ips)))
        yield obj


def running(pod: Obj, ip: str) -> Obj:
    """A pod's status once it runs, as kwok's pod-ready stage writes it."""
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"phase": "Running", "hostIP": NODE_IP, "hostIPs": [{"ip": NODE_IP}],
            "podIP": ip, "podIPs": [{"ip": ip}], "startTime": now,
            "conditions": [{"type": kind, "status": "True", "lastTransitionTime": now}
                           for kind in ("Initialized", "Ready", "ContainersReady")],
            "containerStatuses": [
                {"name": c["name"], "image": c["image"], "ready": True, "started": True,
                 "restartCount": 0, "state": {"running": {"startedAt": now}}}
                for c in pod["spec"]["containers"]]}


STATUS_KINDS = ("AppWrapper", "Pod")  # a create ignores their status


async def create(kube: Kube, obj: Obj) -> None:
    res = RESOURCES[obj["kind"]]
    await retried(lambda: kube.create(res, obj))
    status = obj.get("status") if obj["kind"] in STATUS_KINDS else None
    if status:  # a create ignores the status of a kind with a status subresource
        ns = obj["metadata"]["namespace"]
        await retried(lambda: kube.merge_patch(res, name_of(obj), {"status": status}, ns,
                                               subresource="status"))


async def seed(kube: Kube, objects: Iterable[Obj], heartbeat: str = "kwok") -> None:
    """The namespaces (with their default ServiceAccount, which pods need), then the
    objects (`for_kwok`), created concurrently."""
    await in_parallel(({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
                       for ns in BENCH_NAMESPACES), lambda o: create(kube, o))
    for ns in [*BENCH_NAMESPACES, "kube-system"]:
        await until(lambda ns=ns: _exists(kube, f"/api/v1/namespaces/{ns}/serviceaccounts/default"),
                    60, f"the default ServiceAccount of {ns}")
    await in_parallel(for_kwok(objects, heartbeat), lambda o: create(kube, o))


async def _exists(kube: Kube, path: str) -> bool:
    try:
        await kube.request("GET", path)
        return True
    except KubeError:
        return False


async def until(predicate: Callable[[], Awaitable[bool]], wait_s: float, what: str,
                every_s: float = 0.5) -> None:
    with anyio.fail_after(wait_s):
        while not await predicate():
            await anyio.sleep(every_s)
    log.info("%s: done", what)


async def not_running(kube: Kube, page: int = 500) -> int:
    """Pods not Running yet (kwok is still at work), counted up to `page` (a list
    with a field selector says nothing of what it left out)."""
    listed = await kube.request("GET", PODS.path(None), query={
        "fieldSelector": "status.phase!=Running", "limit": page})
    return len(listed.get("items") or [])


async def not_ready_nodes(kube: Kube) -> int:
    """Nodes still tainted not-ready (the node lifecycle controller lifts the taint
    once kwok reports them Ready; until then each lift is a change healthd acts on)."""
    count, token = 0, None
    while True:
        listed = await kube.list(NODES, limit=500, continue_token=token)
        count += sum(any(t.get("key") == NOT_READY for t in (n.get("spec") or {}).get(
            "taints") or []) for n in listed.get("items") or [])
        token = (listed.get("metadata") or {}).get("continue")
        if not token:
            return count


async def settled(kube: Kube, wait_s: float = SETTLE_WAIT_S) -> float:
    """Seconds until kwok has every pod Running and every node Ready, so that its
    work (and the changes it makes that healthd acts on) is not measured."""
    started = time.monotonic()

    async def done() -> bool:
        left = await not_running(kube)
        log.info("pods not Running yet: %s", left if left < 500 else "500 or more")
        if left:
            return False
        tainted = await not_ready_nodes(kube)
        log.info("nodes not Ready yet: %s", tainted)
        return tainted == 0

    await until(done, wait_s, "every pod Running, every node Ready", every_s=2.0)
    return time.monotonic() - started


async def label_evict(kube: Kube, indexes: list[int]) -> float:
    """Label nodes EVICT with the agent's health annotation, concurrently; the epoch
    time the first write was sent."""
    at = time.time()

    async def write(i: int) -> None:
        fresh = node(i, "EVICT")["metadata"]
        await retried(lambda: kube.merge_patch(NODES, fresh["name"], {"metadata": {
            "labels": fresh["labels"], "annotations": fresh["annotations"]}}))

    await in_parallel(indexes, write)
    return at


# -- agents on the real API server (fault_to_label) ------------------------------------

@contextlib.contextmanager
def agents_on_real(count: int, config: Obj) -> Iterator[tuple[Path, dict[str, Any]]]:
    """The control plane with healthd installed from its manifests, `count` kwok GPU
    nodes and an agent process on each (`tests/e2e`'s helper: the agent runs with a
    token bound to its DaemonSet pod, `config` over the shipped one): the admin
    kubeconfig and the agents by node name."""
    with tempfile.TemporaryDirectory(prefix="healthd-bench-") as tmp, \
            running_plane(Path(tmp) / "plane") as plane:
        from tests.e2e.healthd import healthd_on
        with healthd_on(plane.admin_kubeconfig, Path(tmp)) as healthd:
            healthd.config = config
            healthd.install()
            names = [f"bench-gpu-{i}" for i in range(count)]
            healthd.add_nodes(*names)
            yield plane.admin_kubeconfig, {name: healthd.start_agent(name) for name in names}


class NodeLabels:
    """One label of every GPU node, as a watch shows it; `until` waits for a value."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.values: dict[str, str | None] = {}
        self._changed = anyio.Event()

    async def follow(self, kube: Kube) -> None:
        from tests.e2e.healthd import GPU_NODE_LABEL  # what the agent DaemonSet selects
        async for event in watch_forever(kube, NODES, label_selector=f"{GPU_NODE_LABEL}=true"):
            labels = (event.object.get("metadata") or {}).get("labels") or {}
            self.values[name_of(event.object)] = labels.get(self.key)
            self._changed.set()
            self._changed = anyio.Event()

    async def until(self, name: str, wanted: str, wait_s: float) -> float:
        """Seconds until node `name`'s label reads `wanted` (TimeoutError after
        `wait_s`)."""
        started = time.monotonic()
        with anyio.fail_after(wait_s):
            while self.values.get(name) != wanted:
                await self._changed.wait()
        return time.monotonic() - started


# -- what the benchmark sees of the server --------------------------------------------

async def watch_resets(kube: Kube, log_: ResetLog, listed: anyio.Event) -> None:
    """Every AppWrapper seen `Resetting`, timed when the watch event arrives."""
    async for event in watch_forever(kube, APPWRAPPERS):
        listed.set()
        log_.count(f"appwrapper_{event.type.lower()}")
        if (event.object.get("status") or {}).get("phase") == "Resetting":
            log_.note_reset(name_of(event.object), time.time())


async def watch_events(kube: Kube, log_: ResetLog) -> None:
    """healthd's Events (source component healthd-controller) as they are stored."""
    async for event in watch_forever(kube, EVENTS,
                                     field_selector=f"source={CONTROLLER_COMPONENT}"):
        if event.type == ADDED:
            log_.note_event(time.time())
        else:
            log_.count(f"event_{event.type.lower()}")


_LABEL = re.compile(r'(\w+)="([^"]*)"')


def served(plane: Any) -> dict[str, float]:
    """What kube-apiserver served so far, from its /metrics: requests by verb and
    resource (every client's: kwok's heartbeats, the benchmark's label writes,
    healthd's), request body bytes by verb and resource, and watch events and their
    bytes by kind (what the server pushed to every watcher)."""
    context = ssl.create_default_context(cafile=str(plane.ca))
    context.load_cert_chain(str(plane.pki / "admin.crt"), str(plane.pki / "admin.key"))
    with urllib.request.urlopen(f"{plane.server}/metrics", timeout=60,
                                context=context) as response:
        text = response.read().decode()
    out: Counter[str] = Counter()
    for line in text.splitlines():
        name, _, rest = line.partition("{")
        if name not in _SERVED or "} " not in rest:
            continue
        labels = dict(_LABEL.findall(rest))
        what = labels.get("kind") or "/".join(
            filter(None, (labels.get("resource"), labels.get("subresource"))))
        out[f"{_SERVED[name]} {labels.get('verb', '')} {what}".replace("  ", " ")] += \
            float(rest.rsplit(" ", 1)[1])
    return dict(out)


_SERVED = {"apiserver_request_total": "requests",
           "apiserver_request_body_size_bytes_sum": "request_bytes",
           "apiserver_watch_events_total": "watch_events",
           "apiserver_watch_events_sizes_sum": "watch_bytes"}


async def watch_nodes(kube: Kube, log_: ResetLog) -> None:
    """Node writes (heartbeats, status reports, labels) as watch events, counted, and
    each MODIFIED counted again by its writer (`WRITTEN_BY`)."""
    async for event in watch_forever(kube, NODES):
        log_.count(f"node_{event.type.lower()}")
        if event.type == "MODIFIED":
            log_.count(WRITTEN_BY + writer(event.object))


def writer(obj: Obj) -> str:
    """Who made the object's last write: the newest `managedFields` entry's manager
    and subresource (server-side bookkeeping every write updates)."""
    entries = obj.get("metadata", {}).get("managedFields") or []
    if not entries:
        return "unknown"
    newest = max(entries, key=lambda e: e.get("time") or "")
    return "/".join(filter(None, [newest.get("manager"), newest.get("subresource")]))


class RealSide:
    """`reset_cluster.ServerSide` on the real API server."""

    def __init__(self, portal: BlockingPortal, kube: Kube, pids: list[int],
                 plane: Any) -> None:
        self.portal, self.kube, self.pids, self.plane = portal, kube, pids, plane

    def evict(self, indexes: list[int]) -> float:
        return float(self.portal.call(label_evict, self.kube, indexes))

    def usage(self) -> dict[str, float]:
        return usage(self.pids)

    def served(self) -> dict[str, float]:
        return served(self.plane)


def serve_real(n: int, other_pods: int, heartbeat: str, conn: Connection) -> None:
    """The child of `ProcessCluster(serve=serve_real)`: the control plane seeded with
    `reset_cluster.cluster(n, other_pods)`, its nodes heartbeating as `heartbeat`
    says, then the parent's questions answered."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s real-api %(message)s")
    try:
        with tempfile.TemporaryDirectory(prefix="healthd-bench-") as tmp, \
                running_plane(Path(tmp)) as plane, start_blocking_portal() as portal:
            started = time.monotonic()
            kube: Kube = portal.call(lambda: Kube.connect(str(plane.admin_kubeconfig),
                                                          timeout_s=60))
            resets = ResetLog()
            listed = portal.call(lambda: _event())
            watches = [portal.start_task_soon(watch_events, kube, resets)]
            portal.call(seed, kube, cluster(n, other_pods), heartbeat)
            seed_s = time.monotonic() - started
            settle_s = portal.call(settled, kube)
            settled_at = time.time()
            watches.append(portal.start_task_soon(watch_resets, kube, resets, listed))
            watches.append(portal.start_task_soon(watch_nodes, kube, resets))
            portal.call(lambda: _wait(listed, 60))
            pids = plane.pids()
            conn.send(("ready", {
                "kubeconfig": str(plane.admin_kubeconfig), "seed_s": seed_s,
                "settle_s": round(settle_s, 2), "settled_at": settled_at,
                "heartbeat": heartbeat, "control_plane_rss_mib": {
                    name: usage([pid])["rss_mib"] for name, pid in pids.items()}}))
            try:
                answer(RealSide(portal, kube, [pids["kube-apiserver"], pids["etcd"]], plane),
                       resets, conn)
            finally:
                for watch in watches:
                    watch.cancel()
                portal.call(kube.close)
    except Exception as exc:  # tell the parent instead of leaving it waiting
        traceback.print_exc(file=sys.stderr)
        conn.send(("error", f"{type(exc).__name__}: {exc}"))


async def _event() -> anyio.Event:
    return anyio.Event()  # made on the portal's loop, where it is set and waited for


async def _wait(event: anyio.Event, wait_s: float) -> None:
    with anyio.fail_after(wait_s):
        await event.wait()
