"""The request log and fault injection: what tests assert on and how they break things.

Every request is recorded (method, path, query, content type, parsed body, status,
time, user agent, user, the body's size) so a test can say "no writes" or "exactly
one PATCH to /api/v1/nodes/n1". Faults make the next N requests that match a method and a path
regex fail with a given status (and optional body), or only wait first.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the emulator saw and answered it."""

    method: str
    path: str
    query: dict[str, str]
    content_type: str
    body: Any  # parsed JSON, raw text when not JSON, None when empty
    status: int
    time: float  # time.time() when it arrived
    user_agent: str
    user: str
    size: int = 0  # bytes of the body as sent

    @property
    def is_write(self) -> bool:
        return self.method in WRITE_METHODS


@dataclass
class Fault:
    """Answer the next `times` matching requests with `status` after `delay` seconds.

    `status=None` only delays, then serves the request normally.
    """

    method: str  # "*" for any
    path: re.Pattern[str]
    status: int | None
    body: Any
    delay: float
    times: int
    query: Mapping[str, str] = field(default_factory=dict)  # param -> regex it must fullmatch

    def matches(self, method: str, path: str, query: Mapping[str, str]) -> bool:
        return (
            self.method in ("*", method)
            and self.path.fullmatch(path) is not None
            and all(re.fullmatch(v, query.get(k, "")) for k, v in self.query.items())
        )


class Recorder:
    """Thread-safe log of requests and queue of faults."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: list[RecordedRequest] = []
        self._faults: list[Fault] = []

    def record(self, entry: RecordedRequest) -> None:
        with self._lock:
            self._requests.append(entry)

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    def matching(self, method: str | None = None, path: str | None = None, *,
                 writes_only: bool = False) -> list[RecordedRequest]:
        """Requests by method (exact) and path (regex, full match)."""
        pattern = re.compile(path) if path is not None else None
        return [r for r in self.requests
                if (not writes_only or r.is_write)
                and (method is None or r.method == method.upper())
                and (pattern is None or pattern.fullmatch(r.path))]

    def clear(self) -> None:
        with self._lock:
            self._requests.clear()

    def add_fault(self, fault: Fault) -> None:
        with self._lock:
            self._faults.append(fault)

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def take_fault(self, method: str, path: str, query: Mapping[str, str]) -> Fault | None:
        """The first armed fault for this request, counting it as used."""
        with self._lock:
            for fault in self._faults:
                if fault.matches(method, path, query):
                    fault.times -= 1
                    if fault.times <= 0:
                        self._faults.remove(fault)
                    return fault
        return None


def now() -> float:
    return time.time()
