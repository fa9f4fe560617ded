"""label_to_reset: a node labelled EVICT -> the AppWrapper status write that resets
the work on it, at fleet scale.

The real controller (`healthd.controller.Controller`: Lease, caches from list+watch,
eviction reactor, safety rails, lending) runs in this process against the API
emulator over HTTP. The cluster is seeded straight into the emulator's store:

- N nodes with 8 GPUs each, all PASS;
- N AppWrappers `Running`, AppWrapper j with 4 GPU pods (2 GPUs each) on nodes
  j..j+3, so every node runs pods of 4 AppWrappers;
- 16 more pods per node that belong to no AppWrapper (20 pods per node: 100,000 at
  5,000 nodes), the slack ClusterQueue and its flavor.

Latency: one node at a time turns EVICT (the label and the agent's health
annotation, as the agent writes them); timed from that write to the arrival of
each of its AppWrappers' status PATCH at the server (the request log's clock).
Throughput: 100 other nodes turn EVICT at once; nodes per second until every
AppWrapper on them is reset. The breaker is off (`max_unhealthy: 100%`) and the
rate limit out of the way, as the goals ask; everything else is the default.

Run at 500, 1,000 and 5,000 nodes, with the scaling exponent between the ends
(figure ~ N^k). Goals: p99 <= 1 s at 5,000 nodes; >= 100 nodes/s.

    python bench/label_to_reset.py                     # 500, 1000, 5000 nodes
    python bench/label_to_reset.py --quick             # 200 nodes, fewer faults
    python bench/label_to_reset.py --nodes 500 1000
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from collections.abc import Iterable
from typing import Any

import anyio
from common import Goal, main, parser, summary
from prometheus_client import CollectorRegistry

from healthd.config import Config
from healthd.controller.controller import Controller
from healthd.controller.metrics import ControllerMetrics
from healthd.kube.client import Kube
from healthd.kube.conventions import GPU_RESOURCE, Keys
from healthd.sim.apiserver import ApiEmulator, RecordedRequest

NAME = "label_to_reset"
KEYS = Keys()
AW_LABEL = "workload.codeflare.dev/appwrapper"
PODS_PER_AW = 4
OTHER_PODS_PER_NODE = 16
NAMESPACES = 10
THROUGHPUT_NODES = 100
WAIT_S = 120.0
P99_GOAL_S = 1.0
RATE_GOAL = 100.0
STATUS_PATH = re.compile(r"/apis/workload\.codeflare\.dev/v1beta2/namespaces/[^/]+/"
                         r"appwrappers/[^/]+/status")
Obj = dict[str, Any]


# -- the cluster ----------------------------------------------------------------------

def node(i: int, verdict: str = "PASS") -> Obj:
    capacity = {GPU_RESOURCE: "8", "cpu": "96", "memory": "1Ti", "pods": "110"}
    annotations = {}
    if verdict == "EVICT":
        annotations[KEYS.health] = json.dumps({"verdict": "EVICT", "top": "XID_79", "held": [
            {"code": "XID_79", "severity": "EVICT"}]})
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": f"node-{i:05d}", "labels": {KEYS.gpuhealth: verdict},
                         "annotations": annotations},
            "spec": {}, "status": {"capacity": capacity, "allocatable": capacity}}


def namespace(j: int) -> str:
    return f"team-{j % NAMESPACES}"


def appwrapper(j: int) -> Obj:
    return {"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper",
            "metadata": {"name": f"aw-{j:05d}", "namespace": namespace(j)},
            "spec": {"suspend": False, "components": []},
            "status": {"phase": "Running", "conditions": [
                {"type": "QuotaReserved", "status": "True", "reason": "Resuming",
                 "message": "", "lastTransitionTime": "2025-01-01T00:00:00Z"}]}}


def pod(name: str, ns: str, node_index: int, *, owner: str | None, gpus: int) -> Obj:
    resources = {"requests": {GPU_RESOURCE: str(gpus)}, "limits": {GPU_RESOURCE: str(gpus)}} \
        if gpus else {"requests": {"cpu": "100m"}}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns,
                         "labels": {AW_LABEL: owner} if owner else {"app": "daemon"}},
            "spec": {"nodeName": f"node-{node_index:05d}", "containers": [
                {"name": "main", "image": "trainer", "resources": resources}]},
            "status": {"phase": "Running"}}


def cluster(n: int) -> Iterable[Obj]:
    for i in range(n):
        yield node(i)
    for j in range(n):
        aw = appwrapper(j)
        yield aw
        for k in range(PODS_PER_AW):
            yield pod(f"aw-{j:05d}-{k}", namespace(j), (j + k) % n,
                      owner=aw["metadata"]["name"], gpus=2)
        for k in range(OTHER_PODS_PER_NODE):
            yield pod(f"daemon-{j:05d}-{k}", "kube-system", j, owner=None, gpus=0)
    flavor = "default-flavor"
    yield {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
           "metadata": {"name": flavor}, "spec": {}}
    yield {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
           "metadata": {"name": "slack-cluster-queue"},
           "spec": {"cohortName": "default-cohort", "namespaceSelector": {}, "resourceGroups": [
               {"coveredResources": [GPU_RESOURCE], "flavors": [{"name": flavor, "resources": [
                   {"name": GPU_RESOURCE, "nominalQuota": str(8 * n // 10)}]}]}]}}


def owners_on(i: int, n: int) -> list[tuple[str, str]]:
    """(namespace, name) of the AppWrappers with pods on node i."""
    return [(namespace(j), f"aw-{j:05d}") for j in ((i - k) % n for k in range(PODS_PER_AW))]


def bench_config() -> Config:
    return Config.model_validate({"controller": {
        "breaker": {"max_unhealthy": "100%"},
        "resets": {"rate_per_minute": 1_000_000, "burst": 100_000},
    }})


# -- measuring ------------------------------------------------------------------------

class ResetLog:
    """Accepted AppWrapper status PATCHes as the server records them: name -> arrival
    (epoch seconds). Hooks the emulator's request log, so waiting costs the event
    loop nothing (reading objects back would copy them and slow the controller)."""

    def __init__(self, api: ApiEmulator) -> None:
        self.times: dict[str, float] = {}
        self._changed = anyio.Event()
        record = api.recorder.record

        def recording(entry: RecordedRequest) -> None:
            record(entry)
            if entry.method == "PATCH" and entry.status == 200 and STATUS_PATH.fullmatch(
                    entry.path):
                self.times.setdefault(entry.path.split("/")[-2], entry.time)
                self._changed.set()

        api.recorder.record = recording

    async def wait_for(self, names: Iterable[str]) -> None:
        """Until every AppWrapper in `names` has been reset."""
        pending = set(names)
        with anyio.fail_after(WAIT_S):
            while pending := pending - self.times.keys():
                await self._changed.wait()
                self._changed = anyio.Event()


class Scale:
    """One cluster of N nodes with the controller running on it."""

    def __init__(self, api: ApiEmulator, n: int) -> None:
        self.api, self.n = api, n
        self.resets = ResetLog(api)

    def evict(self, indexes: Iterable[int]) -> float:
        """Label nodes EVICT as their agents would; the epoch time of the writes."""
        at = time.time()
        for i in indexes:
            stored = self.api.get("Node", f"node-{i:05d}")
            assert stored is not None
            fresh = node(i, "EVICT")
            stored["metadata"]["labels"] = fresh["metadata"]["labels"]
            stored["metadata"]["annotations"] = fresh["metadata"]["annotations"]
            self.api.put(stored)
        return at


async def run_scale(n: int, faults: int, burst: int) -> dict[str, Any]:
    async with ApiEmulator() as api:
        started = time.monotonic()
        api.seed(*cluster(n))
        seeded_s = time.monotonic() - started
        scale = Scale(api, n)
        kube = Kube(api.async_client(), timeout_s=30)
        controller = Controller(bench_config(), kube=kube, identity="bench",
                                metrics=ControllerMetrics(CollectorRegistry()))
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(controller.run)
                start = time.monotonic()
                with anyio.fail_after(WAIT_S):
                    while not (controller.term and controller.term.caches.synced):
                        await anyio.sleep(0.01)
                synced_s = time.monotonic() - start
                await anyio.sleep(0.5)  # the first evaluation and lending pass
                latencies = await one_at_a_time(scale, faults)
                rate, burst_s, resets = await at_once(scale, burst)
                group.cancel_scope.cancel()
        finally:
            await kube.close()
    return {"nodes": n, "pods": n * (PODS_PER_AW + OTHER_PODS_PER_NODE), "appwrappers": n,
            "seed_s": round(seeded_s, 2), "controller_sync_s": round(synced_s, 3),
            "latency_s": summary(latencies), "burst_nodes": burst,
            "burst_all_reset_s": round(burst_s, 3), "burst_appwrappers_reset": resets,
            "nodes_per_s": round(rate, 1),
            "appwrapper_resets_per_s": round(resets / max(burst_s, 1e-6), 1)}


async def one_at_a_time(scale: Scale, faults: int) -> list[float]:
    """Latency samples: nodes in the first half, far enough apart that no
    AppWrapper has pods on two of them."""
    stride = max(PODS_PER_AW + 1, (scale.n // 2) // faults)
    samples: list[float] = []
    for f in range(faults):
        i = f * stride + PODS_PER_AW
        owners = [name for _, name in owners_on(i, scale.n)]
        at = scale.evict([i])
        await scale.resets.wait_for(owners)
        samples.extend(scale.resets.times[name] - at for name in owners)
        await anyio.sleep(0.05)
    return samples


async def at_once(scale: Scale, count: int) -> tuple[float, float, int]:
    """(nodes per second, seconds, AppWrappers reset) for `count` nodes of the second
    half at once."""
    first = scale.n // 2 + PODS_PER_AW
    stride = max(1, (scale.n - first) // count)
    indexes = [first + k * stride for k in range(count)]
    owners = {name for i in indexes for _, name in owners_on(i, scale.n)}
    at = scale.evict(indexes)
    await scale.resets.wait_for(owners)
    took = max(max(scale.resets.times[name] for name in owners) - at, 1e-6)
    return count / took, took, len(owners)


def exponent(rows: list[dict[str, Any]], key: str) -> float | None:
    """k in figure ~ N^k between the smallest and largest run."""
    a, b = rows[0], rows[-1]
    va, vb = _get(a, key), _get(b, key)
    if va is None or vb is None or va <= 0 or vb <= 0 or a["nodes"] == b["nodes"]:
        return None
    return round(math.log(vb / va) / math.log(b["nodes"] / a["nodes"]), 3)


def _get(row: dict[str, Any], key: str) -> float | None:
    value: Any = row
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value if isinstance(value, (int, float)) else None


def measure(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Goal], list[str]]:
    sizes = args.nodes or ([200] if args.quick else [500, 1000, 5000])
    faults, burst = (5, 20) if args.quick else (25, THROUGHPUT_NODES)
    smallest = 2 * (burst + faults * (PODS_PER_AW + 1))
    if min(sizes) < smallest:
        raise ValueError(f"--nodes must be at least {smallest} (got {min(sizes)}): the "
                         "faults and the burst need nodes that share no AppWrapper")
    rows = [anyio.run(run_scale, n, faults, burst) for n in sorted(sizes)]
    largest = rows[-1]
    figures = {"scales": rows, "scaling_exponent": {
        key: exponent(rows, key) for key in
        ("latency_s.p50", "latency_s.p99", "controller_sync_s", "nodes_per_s")}}
    goals = {"latency_p99_s_at_largest": Goal(largest["latency_s"]["p99"], P99_GOAL_S),
             "nodes_per_s_at_largest": Goal(largest["nodes_per_s"], RATE_GOAL, ">=")}
    return figures, goals, [
        f"{faults} single-node faults x {PODS_PER_AW} AppWrappers each, then {burst} nodes "
        "at once; breaker off, rate limit raised, other settings default (settle 0.1 s)",
        "the emulator, the controller and the timing loop share one process and event "
        "loop: every request is served by the same core that decides",
    ]


if __name__ == "__main__":
    cli = parser(__doc__.splitlines()[0])
    cli.add_argument("--nodes", type=int, nargs="+", help="cluster sizes (default 500 1000 5000)")
    sys.exit(main(NAME, measure, cli.parse_args()))
