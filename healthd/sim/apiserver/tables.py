"""Server-side printing: the `Table` kubectl asks for, for Events and Nodes.

`kubectl get` asks for `application/json;as=Table;v=v1;g=meta.k8s.io` and prints the
columns the server chose; a server that answers a plain list gets only NAME and AGE.
The real server's printers (Kubernetes 1.35, pkg/printers/internalversion) are ported
here for the kinds a person looks at on the demo: Events (`kubectl get events`) and
Nodes (`kubectl get nodes`). Other kinds answer the plain list, which kubectl prints
as NAME and AGE, as it does for a custom resource without printer columns.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from healthd.sim.apiserver.resources import Obj
from healthd.util.times import parse_time

Column = tuple[str, int, str]  # name, priority (1: only with -o wide), format


def wants_table(accept: str) -> bool:
    return "as=Table" in accept


def human_duration(seconds: float) -> str:
    """apimachinery's duration.HumanDuration: the AGE kubectl shows."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes, hours = s // 60, s // 3600
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    days = hours // 24
    if hours < 24 * 8:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    if hours < 24 * 365 * 2:
        return f"{days}d"
    if hours < 24 * 365 * 8:
        return f"{days // 365}y{days % 365}d" if days % 365 else f"{days // 365}y"
    return f"{days // 365}y"


def _since(stamp: Any) -> str:
    at = parse_time(stamp) if stamp else None
    return "<unknown>" if at is None else human_duration(time.time() - at)


def _event_cells(ev: Obj) -> list[Any]:
    """printEvent, wide (the server sends every column; kubectl hides priority 1)."""
    first = _since(ev.get("firstTimestamp") or ev.get("eventTime"))
    last = _since(ev["lastTimestamp"]) if ev.get("lastTimestamp") else first
    count = ev.get("count") or 1
    series = ev.get("series")
    if isinstance(series, dict):
        last, count = _since(series.get("lastObservedTime")), series.get("count") or 0
    ref = ev.get("involvedObject") or {}
    kind = str(ref.get("kind") or "").lower()
    target = f"{kind}/{ref['name']}" if ref.get("name") else kind
    source = ev.get("source") or {}
    component = source.get("component") or ev.get("reportingComponent") or ""
    instance = source.get("host") or ev.get("reportingInstance") or ""
    return [last, ev.get("type") or "", ev.get("reason") or "", target,
            ref.get("fieldPath") or "", f"{component}, {instance}" if instance else component,
            str(ev.get("message") or "").strip(), first, int(count),
            ev["metadata"].get("name", "")]


EVENT_COLUMNS: list[Column] = [
    ("Last Seen", 0, ""), ("Type", 0, ""), ("Reason", 0, ""), ("Object", 0, ""),
    ("Subobject", 1, ""), ("Source", 1, ""), ("Message", 0, ""), ("First Seen", 1, ""),
    ("Count", 1, ""), ("Name", 1, "name")]


def _node_cells(node: Obj) -> list[Any]:
    """printNode, wide."""
    status = node.get("status") or {}
    ready = [c for c in status.get("conditions") or [] if c.get("type") == "Ready"]
    states = [("Ready" if ready[0].get("status") == "True" else "NotReady")] if ready \
        else ["Unknown"]
    if (node.get("spec") or {}).get("unschedulable"):
        states.append("SchedulingDisabled")
    labels = node["metadata"].get("labels") or {}
    roles = sorted({k.split("/", 1)[1] for k in labels
                    if k.startswith("node-role.kubernetes.io/") and "/" in k}
                   | {v for k, v in labels.items() if k == "kubernetes.io/role" and v})
    info = status.get("nodeInfo") or {}
    addresses = status.get("addresses") or []

    def address(kind: str) -> str:
        return next((a.get("address", "") for a in addresses if a.get("type") == kind),
                    "<none>")

    return [node["metadata"]["name"], ",".join(states), ",".join(roles) or "<none>",
            _since(node["metadata"].get("creationTimestamp")), info.get("kubeletVersion", ""),
            address("InternalIP"), address("ExternalIP"),
            info.get("osImage") or "<unknown>", info.get("kernelVersion") or "<unknown>",
            info.get("containerRuntimeVersion") or "<unknown>"]


NODE_COLUMNS: list[Column] = [
    ("Name", 0, "name"), ("Status", 0, ""), ("Roles", 0, ""), ("Age", 0, ""),
    ("Version", 0, ""), ("Internal-IP", 1, ""), ("External-IP", 1, ""), ("OS-Image", 1, ""),
    ("Kernel-Version", 1, ""), ("Container-Runtime", 1, "")]

PRINTERS: dict[tuple[str, str], tuple[list[Column], Callable[[Obj], list[Any]]]] = {
    ("", "Event"): (EVENT_COLUMNS, _event_cells),
    ("", "Node"): (NODE_COLUMNS, _node_cells),
}


def table(group: str, kind: str, items: list[Obj], resource_version: str) -> Obj | None:
    """The Table for `items` (as the core v1 resource shows them), or None when the
    kind has no printer here. Each row carries the object's metadata, as the real
    server's default `includeObject=Metadata` does."""
    printer = PRINTERS.get((group, kind))
    if printer is None:
        return None
    columns, cells = printer
    return {
        "kind": "Table", "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": [{"name": name, "type": "string",
                               "format": fmt, "description": "", "priority": priority}
                              for name, priority, fmt in columns],
        "rows": [{"cells": cells(item),
                  "object": {"kind": "PartialObjectMetadata",
                             "apiVersion": "meta.k8s.io/v1", "metadata": item["metadata"]}}
                 for item in items],
    }
