"""A pod's networks, as Multus reports them in its `network-status` annotation.

Multus (and OpenShift, which also spells the key `networks-status`) writes a JSON
list with one entry per attachment::

    [{"name": "k8s-pod-network", "interface": "eth0", "ips": ["10.128.2.7"],
      "default": true},
     {"name": "healthd-system/net1", "interface": "net1", "ips": ["192.168.1.7"]}]

The entry marked `default: true` (or named on interface `eth0` when no entry is
marked) is the pod network, which healthd reads from `status.podIPs` instead; every
other entry is a secondary network, named by its attachment name without the
namespace (`net1`) unless two attachments share that short name. An entry with no
`ips` still names an interface (for the `nic` check) but gives ping nothing.

The annotation comes from another controller and may be anything: garbage, the
wrong shape or an oversized value gives NO secondary networks (the pod network
still works) and one clear log line per pod and value, never an exception.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from checks.base import POD_NETWORK, Attachment
from healthd.kube.conventions import NETWORK_STATUS_ANNOTATIONS
from healthd.kube.objects import Unreadable, bounded_json

log = logging.getLogger(__name__)

MAX_ANNOTATION_BYTES = 64 * 1024  # a pod with dozens of NICs stays far below this
MAX_ATTACHMENTS = 64
MAX_IPS = 16  # per attachment


class BadNetworkStatus(ValueError):
    """The annotation is there but cannot be read; the message says why."""


@dataclass(frozen=True)
class NetworkStatus:
    """A pod's secondary networks (the pod network left out) and, when the
    annotation could not be read, why."""

    attachments: tuple[Attachment, ...] = ()
    problem: str = ""

    def addresses(self) -> dict[str, tuple[str, ...]]:
        """network -> IP addresses, for networks that have any (ping's peers)."""
        return {a.network: a.addresses for a in self.attachments if a.addresses}


def network_status(pod: Mapping[str, Any]) -> NetworkStatus:
    """The pod's secondary networks from its annotation (either spelling); an
    absent annotation is simply no secondary network."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    if not isinstance(annotations, Mapping):
        return NetworkStatus()
    raw = next((annotations[k] for k in NETWORK_STATUS_ANNOTATIONS if k in annotations), None)
    if raw is None:
        return NetworkStatus()
    try:
        return NetworkStatus(parse(raw))
    except BadNetworkStatus as exc:
        return NetworkStatus(problem=str(exc))


def parse(raw: object) -> tuple[Attachment, ...]:
    """The secondary attachments in an annotation value; BadNetworkStatus when it
    is not a network-status list."""
    if not isinstance(raw, str):
        raise BadNetworkStatus("the annotation is not a string")
    try:
        entries = bounded_json(raw, max_bytes=MAX_ANNOTATION_BYTES)
    except Unreadable as exc:
        raise BadNetworkStatus(f"the annotation cannot be read ({exc})") from exc
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise BadNetworkStatus("the annotation is not a list of network objects")
    if len(entries) > MAX_ATTACHMENTS:
        raise BadNetworkStatus(f"the annotation lists more than {MAX_ATTACHMENTS} networks")
    secondary = [e for e in entries if not _is_pod_network(e, entries)]
    short = [_short(e) for e in secondary]
    return tuple(
        Attachment(network=name if short.count(name) == 1 and name != POD_NETWORK
                   else str(entry.get("name")),
                   interface=str(entry.get("interface") or ""),
                   addresses=_ips(entry))
        for entry, name in zip(secondary, short, strict=True) if _valid(entry))


def _is_pod_network(entry: dict[str, Any], entries: list[dict[str, Any]]) -> bool:
    if any(e.get("default") is True for e in entries):
        return entry.get("default") is True
    return entry.get("interface") == "eth0"  # an old Multus that marks nothing


def _valid(entry: dict[str, Any]) -> bool:
    name, interface = entry.get("name"), entry.get("interface")
    return (isinstance(name, str) and bool(name.strip()) and len(name) <= 253
            and (interface is None or (isinstance(interface, str) and len(interface) <= 15)))


def _short(entry: dict[str, Any]) -> str:
    """`healthd-system/net1` -> `net1` (the attachment's own name)."""
    return str(entry.get("name") or "").rpartition("/")[2]


def _ips(entry: dict[str, Any]) -> tuple[str, ...]:
    ips = entry.get("ips")
    if not isinstance(ips, list):
        return ()
    out: list[str] = []
    for ip in ips[:MAX_IPS]:
        if isinstance(ip, str):
            try:
                out.append(str(ipaddress.ip_address(ip.strip())))
            except ValueError:
                continue  # one bad address does not spoil the others
    return tuple(out)


class ProblemLog:
    """Logs each pod's unreadable annotation once per distinct problem, so a watch
    that replays the same pod does not repeat itself."""

    def __init__(self) -> None:
        self._said: dict[str, str] = {}

    def note(self, pod_key: str, status: NetworkStatus) -> None:
        if not status.problem:
            self._said.pop(pod_key, None)
            return
        if self._said.get(pod_key) == status.problem:
            return
        self._said[pod_key] = status.problem
        log.warning("pod %s: cannot read its network-status annotation: %s; it is probed "
                    "on the pod network only", pod_key, status.problem)
