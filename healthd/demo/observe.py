"""What the demo shows and judges: the cluster's observable state, read back.

`observe(cluster)` reads what any user of the cluster could see (the Nodes'
labels, condition, cordon, `last-run` answer and the findings their `health`
annotation lists; AppWrapper phases and where their pods run; the slack queues'
lendingLimits against nominalQuota; the controller's breaker and network-blame
gauges) into one plain JSON-able `State`. The view draws it, the player
judges expectations against it, `--output json` records it. `changes(old, new)`
says what moved, one line per change; `EventLog` collects Events once each.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from healthd.kube.conventions import APPWRAPPER_LABEL, CONDITION_TYPE, Keys
from healthd.kube.objects import (
    condition_of,
    labels_of,
    namespace_of,
    natural_name_key,
    node_name_of,
    phase_of,
    spec_of,
)
from healthd.kube.shapes import AppWrapper, Node, Pod, view
from healthd.published import Health, Holding, LastRun, Seen, read_health, read_last_run

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from healthd.demo.cluster import DemoCluster

State = dict[str, Any]
BREAKER_GAUGE = "healthd_controller_breaker_open"
BLAMED_GAUGE = "healthd_network_blamed"
NONE = "(none)"


def _condition(node: dict[str, Any]) -> str | None:
    cond = condition_of(view(Node, node), CONDITION_TYPE)
    return None if cond is None else str(cond.get("status"))


def _last_run(node: dict[str, Any], keys: Keys) -> dict[str, Any] | None:
    run = read_last_run(node, keys)
    if not isinstance(run, LastRun):
        return None
    return {"kind": run.kind, "request": run.request, "accepted": run.accepted,
            "error": run.error}


def _findings(node: dict[str, Any], keys: Keys) -> list[str]:
    """`code@entity` of every finding the agent's health annotation lists."""
    health = read_health(node, keys)
    if not isinstance(health, Health):
        return []
    items: list[Holding | Seen] = [*health.held, *health.findings]
    return sorted({f"{i.code}@{i.entity}" for i in items})


def node_state(node: dict[str, Any], keys: Keys,
               blamed: dict[str, list[str]] | None = None) -> dict[str, Any]:
    return {"verdict": labels_of(node).get(keys.gpuhealth),
            "condition": _condition(node),
            "cordoned": bool(spec_of(node).get("unschedulable")),
            "last_run": _last_run(node, keys),
            "findings": _findings(node, keys),
            "blamed_on": (blamed or {}).get(node["metadata"]["name"], [])}


def _blamed(registry: CollectorRegistry) -> dict[str, list[str]]:
    """node -> the networks the controller blames it on (its blame gauge)."""
    out: dict[str, list[str]] = {}
    for family in registry.collect():
        if family.name == BLAMED_GAUGE:
            for sample in family.samples:
                if sample.value == 1:
                    out.setdefault(sample.labels["node"], []).append(sample.labels["network"])
    return {node: sorted(networks) for node, networks in out.items()}


def _queue_state(queue: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for group in (queue.get("spec") or {}).get("resourceGroups") or []:
        for flavor in group.get("flavors") or []:
            for res in flavor.get("resources") or []:
                out[f"{flavor.get('name')}/{res.get('name')}"] = {
                    "nominal": str(res.get("nominalQuota")),
                    "limit": None if res.get("lendingLimit") is None
                    else str(res["lendingLimit"])}
    return out


def observe(cluster: DemoCluster) -> State:
    """The cluster as a user sees it now (read from the emulator's store)."""
    api, keys = cluster.api, cluster.keys
    pods_of: dict[str, list[str]] = {}
    for pod in (view(Pod, obj) for obj in api.list("Pod")):
        owner = labels_of(pod).get(APPWRAPPER_LABEL)
        where = node_name_of(pod)
        if owner and where and phase_of(pod) == "Running":
            key = f"{namespace_of(pod)}/{owner}"
            pods_of.setdefault(key, []).append(str(where))
    appwrappers = {}
    for aw in api.list("AppWrapper"):
        key = f"{aw['metadata'].get('namespace')}/{aw['metadata']['name']}"
        appwrappers[key] = {"phase": phase_of(view(AppWrapper, aw)),
                            "nodes": sorted(pods_of.get(key, []), key=natural_name_key)}
    slack = cluster.config.controller.slack_queues
    breaker = cluster.controller.metrics.registry.get_sample_value(BREAKER_GAUGE)
    blamed = _blamed(cluster.controller.metrics.registry)
    return {
        "nodes": {n["metadata"]["name"]: node_state(n, keys, blamed)
                  for n in sorted(api.list("Node"),
                                  key=lambda n: natural_name_key(n["metadata"]["name"]))},
        "appwrappers": dict(sorted(appwrappers.items())),
        "lending": {q["metadata"]["name"]: _queue_state(q) for q in api.list("ClusterQueue")
                    if q["metadata"]["name"] in slack},
        "breaker_open": bool(breaker),
    }


def changes(old: State | None, new: State) -> list[str]:
    """One line per observable change from `old` to `new` (everything when None)."""
    old = old or {"nodes": {}, "appwrappers": {}, "lending": {}, "breaker_open": False}
    return list(_changes(old, new))


def _changes(old: State, new: State) -> Iterator[str]:
    for name, now in new["nodes"].items():
        was = old["nodes"].get(name, {})
        if was.get("verdict") != now["verdict"]:
            yield f"{name}: {was.get('verdict') or NONE} -> {now['verdict'] or NONE}"
        if was.get("cordoned", False) != now["cordoned"]:
            yield f"{name}: {'cordoned' if now['cordoned'] else 'uncordoned'}"
        if now["last_run"] and was.get("last_run") != now["last_run"]:
            run = now["last_run"]
            verb = "accepted" if run["accepted"] else f"refused: {run['error']}"
            asked = request_text(run)
            yield f"{name}: {asked} {verb}"
    for key, now in new["appwrappers"].items():
        was = old["appwrappers"].get(key, {})
        if (was.get("phase"), was.get("nodes")) != (now["phase"], now["nodes"]):
            where = f" on {', '.join(now['nodes'])}" if now["nodes"] else ""
            yield f"AppWrapper {key}: {now['phase'] or 'new'}{where}"
    for queue, resources in new["lending"].items():
        for res, now in resources.items():
            was = old["lending"].get(queue, {}).get(res, {})
            if was.get("limit", now["limit"]) != now["limit"] or not was:
                yield (f"{queue} {res}: lendingLimit {_limit(now['limit'])} "
                       f"(nominal {now['nominal']})")
    if old["breaker_open"] != new["breaker_open"]:
        yield f"circuit breaker {'OPEN: resets stopped' if new['breaker_open'] else 'closed'}"


def request_text(run: dict[str, Any]) -> str:
    """How an on-demand request reads: `clear` or `run 'pciebw,remapped'`."""
    return "clear request" if run.get("kind") == "clear" else f"run request {run['request']!r}"


def _limit(value: str | None) -> str:
    return NONE if value is None else value


class EventLog:
    """Events as they appear (each once; a repeat of a counted Event shows again)."""

    def __init__(self) -> None:
        self._seen: dict[str, Any] = {}
        self.events: list[dict[str, Any]] = []

    def collect(self, cluster: DemoCluster, t: float) -> list[dict[str, Any]]:
        fresh = []
        for event in cluster.api.list("Event"):
            uid = event["metadata"].get("uid") or event["metadata"]["name"]
            count = event.get("count") or 1
            if self._seen.get(uid) == count:
                continue
            self._seen[uid] = count
            involved = event.get("involvedObject") or {}
            fresh.append({"t": round(t, 2), "type": event.get("type") or "",
                          "reason": event.get("reason") or "",
                          "object": involved.get("name") or "",
                          "kind": involved.get("kind") or "",
                          "message": event.get("message") or ""})
        self.events.extend(fresh)
        return fresh
