"""`healthd status`: the fleet and the controller at a glance, as one JSON document.

`build` is pure: a `Snapshot` of API objects and "now" in, the status document out.
The table (healthd.fleet.render) is drawn from the same document, so `--output
json` and the table never disagree. The document is a public interface; its
schema (`SCHEMA_VERSION` 1) only grows, and a change of meaning bumps the version:

    schema_version      1
    generated_at        RFC 3339 time of the view
    filters             {selector: str|null, verdicts: [str]|null}
    summary             {nodes: int, verdicts: {VERDICT: int}, without_agent: int,
                        agent_not_ready: int (running agent pods that are not Ready),
                        gpu_nodes: int (GPU nodes the selector matched, before --verdict)}
    nodes[]             one per GPU node (GPU capacity, or a health label), by name:
      name              node name
      verdict           PASS WARN ERR TESTING EVICT (the label); UNKNOWN (agent cannot
                        judge yet); NONE (nothing published)
      since             when the verdict last changed (RFC 3339) or null
      since_age_s       seconds since then, or null
      top_codes         finding codes holding the verdict, most severe first
      flaps             how often the findings holding the verdict came back soon after
                        a release (the agent holds each one longer every time)
      last_round        latest change of a per-check status in the health annotation
                        (RFC 3339) or null. The agent writes only on change, so this
                        is NOT a sign of life: see agent_ready
      last_round_age_s  seconds since then, or null
      agent             a running agent pod is on the node
      agent_pod         that pod's name (the newest one on the node), or null
      agent_ready       its Ready condition (the agent's /readyz, as the kubelet
                        probes it): true, false, or null without a pod
      agent_restarts    its containers' restarts (null without a pod)
      agent_restarted_age_s  seconds since its last restart, or null
      gpus              GPU capacity
      cordoned, ready   spec.unschedulable; the Ready condition (null when unknown)
      health_unreadable why the health annotation cannot be read (too large, nested
                        too deep, not JSON: someone else wrote it), or null
      blamed            most of its peers cannot reach it by ping (the controller's
                        fleet network blame); false without ping reports
      repair            the controller's repair of the node (its `healthd.io/repair`
                        annotation), or null when it has none: {state (waiting, held,
                        resetting, validating, hardware-inspection, "" idle), since,
                        since_age_s, gpus: [uuid], reason, attempts: int}
    controller
      leader            {holder: str|null, renewed: str|null, expired: bool}
      kueue             the Kueue API version read (e.g. kueue.x-k8s.io/v1beta2) or null
      lending[]         per slack queue, flavor and resource: queue, flavor, resource,
                        nominal, lending_limit (on the queue now; null: none), due (what
                        the controller will write; null: none), unavailable, shortfall,
                        nodes (the bad nodes behind it); quantities are strings
      breaker           {state: open|closed, since: str|null, message: str}
      resets_last_hour  AppWrapper resets in the last hour (NodeEvicted Events)
      resets[]          {appwrapper, at, message}, newest first
      problems[]        sources that could not be read; the rest is still right
      network           the agents' ping reports judged as the controller judges them:
                        {reporters: int (nodes publishing ping results), blamed: [str],
                        isolated: [str], partitioned: bool, why: str (the partition)}
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from healthd.blame.networks import Assessment, assess, rows_of
from healthd.capacity.health import gpu_count, unavailability
from healthd.capacity.lending import LendingModel, format_quantity
from healthd.config import Config
from healthd.fleet.sources import Snapshot
from healthd.kube.conventions import GPU_RESOURCE, Keys, Reason, Verdict
from healthd.kube.leases import holder_of, is_expired
from healthd.kube.objects import (
    condition_of,
    container_statuses_of,
    is_cordoned,
    labels_of,
    meta,
    name_of,
    namespace_of,
    node_labels_of,
    node_name_of,
    phase_of,
)
from healthd.kube.pods import is_terminated
from healthd.kube.shapes import Event, Lease, Node, Pod, part
from healthd.published import Health, Repair, Undecodable, read_health, read_repair
from healthd.util.times import parse_time, rfc3339

SCHEMA_VERSION = 1
UNKNOWN = "UNKNOWN"  # the agent publishes but cannot judge yet
NONE = "NONE"  # nothing published on the node
VERDICTS = (*(v.value for v in Verdict), UNKNOWN, NONE)
_LABELS = frozenset(v.value for v in Verdict)
RESET_WINDOW_S = 3600.0
RESETS_SHOWN = 20
TOP_CODES = 5


def build(snap: Snapshot, config: Config, *, now: float, selector: str | None = None,
          verdicts: Iterable[str] | None = None) -> dict[str, Any]:
    """The status document (see the module docstring)."""
    keys = Keys(config.label_prefix, config.own_prefix)
    wanted = set(verdicts) if verdicts else None
    agents = agent_pods_by_node(snap.agent_pods.values())
    network = assess(rows_of(snap.nodes.values(), keys))  # every node, whatever is shown
    rows, gpu_nodes = [], 0
    for node in sorted(snap.nodes.values(), key=name_of):
        if not is_gpu_node(node, keys) or (snap.shown is not None and
                                           name_of(node) not in snap.shown):
            continue
        gpu_nodes += 1
        row = node_row(node, keys, agents, now, blamed=name_of(node) in network.blamed)
        if wanted is None or row["verdict"] in wanted:
            rows.append(row)
    return {
        "schema_version": SCHEMA_VERSION,
        "generated_at": rfc3339(now),
        "filters": {"selector": selector or None,
                    "verdicts": sorted(wanted) if wanted else None},
        "summary": {**_summary(rows), "gpu_nodes": gpu_nodes},
        "nodes": rows,
        "controller": controller_view(snap, config, keys, now, network=network),
    }


def dumps(doc: Mapping[str, Any]) -> str:
    return json.dumps(doc, indent=2)


# -- nodes -----------------------------------------------------------------------------


def is_gpu_node(node: Node, keys: Keys) -> bool:
    """A node with GPU capacity, or one an agent has labelled."""
    return gpu_count(node, GPU_RESOURCE) > 0 or keys.gpuhealth in labels_of(node)


def agent_nodes(pods: Iterable[Pod]) -> set[str]:
    """Nodes with a running (bound, not terminated) agent pod."""
    return {node for node, pod in agent_pods_by_node(pods).items() if _running(pod)}


def agent_pods_by_node(pods: Iterable[Pod]) -> dict[str, Pod]:
    """Per node, its agent pod: a running one first, else the newest."""
    out: dict[str, Pod] = {}
    for pod in pods:
        node = node_name_of(pod)
        if not node:
            continue
        held = out.get(str(node))
        if held is None or (_running(pod), _created(pod)) > (_running(held), _created(held)):
            out[str(node)] = pod
    return out


def _running(pod: Pod) -> bool:
    return phase_of(pod) == "Running" and not is_terminated(pod)


def _created(pod: Pod) -> str:
    return str(meta(pod).get("creationTimestamp") or "")


def agent_health(pod: Pod | None, now: float) -> dict[str, Any]:
    """The agent pod's readiness and restarts, as `kubectl get pods` shows them."""
    if pod is None:
        return {"agent_pod": None, "agent_ready": None, "agent_restarts": None,
                "agent_restarted_age_s": None}
    ready = _ready(pod) is True
    containers = container_statuses_of(pod)
    restarts = sum(int(c.get("restartCount") or 0) for c in containers)
    ended = [parse_time(part(part(c.get("lastState")).get("terminated")).get("finishedAt"))
             for c in containers]
    last = max((t for t in ended if t is not None), default=None)
    return {"agent_pod": name_of(pod), "agent_ready": ready and _running(pod),
            "agent_restarts": restarts, "agent_restarted_age_s": _age(last, now)}


def node_row(node: Node, keys: Keys, agents: Mapping[str, Pod], now: float, *,
             blamed: bool = False) -> dict[str, Any]:
    doc = read_health(node, keys)
    health = doc if isinstance(doc, Health) else None
    label = labels_of(node).get(keys.gpuhealth)
    verdict = label if label in _LABELS else (UNKNOWN if health else NONE)
    since = parse_time(health.since) if health else None
    last = _last_round(health)
    return {
        "name": name_of(node),
        "verdict": verdict,
        "since": rfc3339(since) if since is not None else None,
        "since_age_s": _age(since, now),
        "top_codes": top_codes(health),
        "flaps": held_flaps(health),
        "last_round": rfc3339(last) if last is not None else None,
        "last_round_age_s": _age(last, now),
        "agent": name_of(node) in agents and _running(agents[name_of(node)]),
        **agent_health(agents.get(name_of(node)), now),
        "gpus": int(gpu_count(node, GPU_RESOURCE)),
        "cordoned": is_cordoned(node),
        "ready": _ready(node),
        "blamed": blamed,
        "health_unreadable": doc.why if isinstance(doc, Undecodable) else None,
        "repair": repair_view(node, keys, now),
    }


def repair_view(node: Node, keys: Keys, now: float) -> dict[str, Any] | None:
    """The node's repair as the controller records it; None without a readable one."""
    repair = read_repair(node, keys)
    if not isinstance(repair, Repair):
        return None
    since = parse_time(repair.since)
    return {"state": repair.state, "since": repair.since or None,
            "since_age_s": _age(since, now), "gpus": list(repair.gpus),
            "reason": repair.reason, "attempts": len(repair.attempts)}


def top_codes(health: Health | None) -> list[str]:
    """Codes holding the verdict, most severe first (the annotation's order), then top."""
    if health is None:
        return []
    codes = [h.code for h in health.held if h.code]
    if not codes and health.top is not None:
        codes = [health.top]
    return list(dict.fromkeys(codes))[:TOP_CODES]


def held_flaps(health: Health | None) -> int:
    """Flaps of the findings holding the verdict, summed (0 for an older agent)."""
    return sum(h.flaps for h in health.held if h.flaps > 0) if health else 0


def _last_round(health: Health | None) -> float | None:
    """When a check's published status last changed."""
    times = [parse_time(c.at) for c in health.checks.values()] if health else []
    return max((t for t in times if t is not None), default=None)


def _age(at: float | None, now: float) -> float | None:
    return None if at is None else round(max(0.0, now - at), 3)


def _ready(obj: Node | Pod) -> bool | None:
    """A node's or a pod's Ready condition; None when it has none."""
    cond = condition_of(obj, "Ready")
    return None if cond is None else cond.get("status") == "True"


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    counts = dict.fromkeys(VERDICTS, 0)
    for row in rows:
        counts[row["verdict"]] += 1
    return {"nodes": len(rows), "verdicts": counts,
            "without_agent": sum(1 for r in rows if not r["agent"]),
            "agent_not_ready": sum(1 for r in rows if r["agent"] and not r["agent_ready"])}


# -- the controller's view -------------------------------------------------------------


def controller_view(snap: Snapshot, config: Config, keys: Keys, now: float, *,
                    network: Assessment | None = None) -> dict[str, Any]:
    if network is None:
        network = assess(rows_of(snap.nodes.values(), keys))
    events = sorted(snap.events.values(), key=_event_time, reverse=True)
    resets = [e for e in events if e.get("reason") == Reason.NODE_EVICTED.value]
    recent = [e for e in resets if now - _event_time(e) <= RESET_WINDOW_S]
    return {
        "leader": _leader(snap.lease, now),
        "kueue": snap.kueue.queues.api_version if snap.kueue else None,
        "lending": lending_rows(snap, config, keys),
        "breaker": _breaker(events),
        "resets_last_hour": len(recent),
        "resets": [_reset(e) for e in recent[:RESETS_SHOWN]],
        "problems": [f"{source}: {why}" for source, why in sorted(snap.problems.items())],
        "network": {"reporters": network.reporters, "blamed": sorted(network.blamed),
                    "isolated": list(network.isolated), "partitioned": network.partitioned,
                    "why": network.why},
    }


def lending_rows(snap: Snapshot, config: Config, keys: Keys) -> list[dict[str, Any]]:
    """What the controller's lending model makes of these objects, per slack queue entry."""
    settings = config.controller
    model = LendingModel()
    model.set_flavors({name_of(f): node_labels_of(f) for f in snap.flavors.values()})
    for node in snap.nodes.values():
        model.set_node(name_of(node), unavailability(
            node, keys=keys, bad_verdicts=settings.bad_verdicts,
            source=settings.capacity_source,
            health_resources=frozenset(settings.health_resources)))
    rows = []
    for name in settings.slack_queues:
        queue = snap.queues.get(name)
        for c in model.evaluate(queue) if queue is not None else []:
            rows.append({
                "queue": c.queue, "flavor": c.flavor, "resource": c.resource,
                "nominal": c.nominal, "lending_limit": c.old, "due": c.new,
                "unavailable": format_quantity(c.unavailable, c.nominal),
                "shortfall": format_quantity(c.shortfall, c.nominal),
                "nodes": model.nodes_behind(c.flavor, c.resource),
            })
    return rows


def _leader(lease: Lease | None, now: float) -> dict[str, Any]:
    if lease is None:
        return {"holder": None, "renewed": None, "expired": True}
    renewed = parse_time(part(lease.get("spec")).get("renewTime"))
    return {"holder": holder_of(lease) or None,
            "renewed": rfc3339(renewed) if renewed is not None else None,
            "expired": is_expired(lease, now)}


def _event_time(event: Event) -> float:
    for at in (event.get("lastTimestamp"), event.get("eventTime"), event.get("firstTimestamp")):
        seconds = parse_time(at)
        if seconds is not None:
            return seconds
    return parse_time(meta(event).get("creationTimestamp")) or 0.0


def _breaker(events_newest_first: list[Event]) -> dict[str, Any]:
    """The latest breaker Event says its state; none at all: closed."""
    reasons = {Reason.RESET_BREAKER_OPEN.value: "open", Reason.RESET_BREAKER_CLOSED.value: "closed"}
    for event in events_newest_first:
        state = reasons.get(str(event.get("reason")))
        if state is not None:
            return {"state": state, "since": rfc3339(_event_time(event)),
                    "message": str(event.get("message") or "")}
    return {"state": "closed", "since": None, "message": "no breaker Event seen"}


def _reset(event: Event) -> dict[str, Any]:
    involved = part(event.get("involvedObject"))
    namespace = involved.get("namespace") or namespace_of(event) or ""
    return {"appwrapper": f"{namespace}/{involved.get('name', '')}",
            "at": rfc3339(_event_time(event)),
            "message": str(event.get("message") or "")}
