"""`RequestTally`: what a client asked of the API server, by kind, and its bytes.

A `Kube` with a tally notes every request it completes (watches excepted: those are
the server's to push): its kind, the bytes of the body it sent (serialized as the
REST client sends it) and of the answer it read. The kind is the verb and the
collection (`PATCH appwrappers/status`, `GET nodes`); an Event's kind also names
what it is about (`POST events/AppWrapper`), since Events on a job and Events on a
node are read by different people. A request the server refused is counted under
its kind with ` (error)` added. Meant for measuring (the benchmarks, tests): counting
costs a serialization of each body, so production clients run without one.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

# /api/v1/[namespaces/NS/]PLURAL[/NAME[/SUB]] and /apis/GROUP/VERSION/...
_PATH = re.compile(r"/apis?/(?:[^/]+/)?v[^/]*/(?:namespaces/[^/]+/)?"
                   r"(?P<plural>[^/]+)(?:/(?P<name>[^/]+)(?:/(?P<sub>[^/]+))?)?")
ERROR = " (error)"


def kind_of(method: str, path: str, body: Any = None) -> str:
    """`PATCH appwrappers/status`, `POST events/Node`, `GET nodes`: what a request is."""
    match = _PATH.fullmatch(path)
    if match is None:
        return f"{method} {path}"
    what = match["plural"]
    if match["sub"]:
        what = f"{what}/{match['sub']}"
    if what == "events" and isinstance(body, dict):
        involved = body.get("involvedObject") or body.get("regarding")
        if isinstance(involved, dict) and involved.get("kind"):
            what = f"events/{involved['kind']}"
    return f"{method} {what}"


def body_bytes(body: Any) -> int:
    """Bytes of `body` on the wire, serialized as the REST client serializes it."""
    if body is None:
        return 0
    if isinstance(body, (str, bytes)):
        return len(body)
    return len(json.dumps(body).encode())


@dataclass
class RequestTally:
    """Requests, bytes sent and bytes received, per kind (see the module docstring)."""

    requests: Counter[str] = field(default_factory=Counter)
    sent: Counter[str] = field(default_factory=Counter)
    received: Counter[str] = field(default_factory=Counter)

    def note(self, method: str, path: str, body: Any, received: int, *,
             failed: bool = False) -> None:
        kind = kind_of(method, path, body) + (ERROR if failed else "")
        self.requests[kind] += 1
        self.sent[kind] += body_bytes(body)
        self.received[kind] += received

    def snapshot(self) -> RequestTally:
        return RequestTally(Counter(self.requests), Counter(self.sent), Counter(self.received))

    def since(self, before: RequestTally) -> RequestTally:
        """What was noted after `before` (a `snapshot`)."""
        return RequestTally(self.requests - before.requests, self.sent - before.sent,
                            self.received - before.received)

    def per(self, count: int) -> dict[str, dict[str, float]]:
        """Per kind: requests, bytes sent and received, each divided by `count` (e.g.
        per reset)."""
        count = max(count, 1)
        return {kind: {"requests": round(n / count, 3),
                       "sent_bytes": round(self.sent[kind] / count, 1),
                       "received_bytes": round(self.received[kind] / count, 1)}
                for kind, n in sorted(self.requests.items())}

    def totals(self) -> dict[str, int]:
        return {"requests": sum(self.requests.values()), "sent_bytes": sum(self.sent.values()),
                "received_bytes": sum(self.received.values())}
