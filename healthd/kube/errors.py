"""The errors of healthd's Kubernetes layer: what callers catch instead of client exceptions.

Every failure of a request made through `healthd.kube` (an HTTP status, a refused or
reset connection, a timeout, a body that is not JSON) becomes one of these, so no
caller ever imports `kubernetes` or `aiohttp` to handle an error. The tree::

    KubeError                 anything else (400, 405, 415, ...): status, reason, message
    ├── Unavailable           try again later: no connection, timeout, 5xx, 429
    ├── NotFound              404
    ├── Conflict              409: stale resourceVersion or AlreadyExists
    ├── Invalid               422, including a failed JSON-patch `test`
    │   └── TooLarge          422 for a field too long (all annotations over 256 KiB)
    ├── Forbidden             401 and 403
    ├── Undecodable           an answer holding one object nested too deep to decode
    └── Gone                  410: a watch or list resourceVersion too old (or, with
                              504, too large: a restored or replaced server); relist
"""

from __future__ import annotations

import json
from typing import Any

from healthd.kube.objects import bounded_json


class KubeError(Exception):
    """A request the API server refused or could not be reached for.

    `status` is the HTTP status (None when no answer came), `reason` the Status
    reason (`NotFound`, `Conflict`, ... or a short word for transport failures) and
    `message` the server's own explanation, fit for a log line or an Event.
    """

    def __init__(self, message: str, *, status: int | None = None, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message

    def __str__(self) -> str:
        code = f"{self.status} " if self.status is not None else ""
        reason = f"{self.reason}: " if self.reason else ""
        return f"{code}{reason}{self.message}".strip()


class Unavailable(KubeError):
    """The server did not answer usefully now; the same request may work later.

    `retry_after` carries the server's Retry-After hint (seconds) when it sent one.
    """

    def __init__(self, message: str, *, status: int | None = None, reason: str = "",
                 retry_after: float | None = None) -> None:
        super().__init__(message, status=status, reason=reason)
        self.retry_after = retry_after


class NotFound(KubeError):
    """404: the object or the collection does not exist."""


class Conflict(KubeError):
    """409: the object changed since it was read, or already exists."""


class Invalid(KubeError):
    """422: the server rejected the content, e.g. a JSON-patch `test` that failed."""


class TooLarge(Invalid):
    """422 because a field would be too long, e.g. an object's annotations together
    past the server's 256 KiB: the same write will never succeed, only a smaller one."""


class Forbidden(KubeError):
    """401/403: the credentials may not do this (RBAC)."""


class Gone(KubeError):
    """410: the resourceVersion is older than the server's history; relist."""


class Undecodable(KubeError):
    """The answer is one object nested deeper than healthd can decode (what the API
    server stores, it may nest 10,000 levels deep); asking again will not help."""

    def __init__(self, message: str) -> None:
        super().__init__(message, reason="Undecodable")


_BY_STATUS: dict[int, type[KubeError]] = {
    401: Forbidden,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: Gone,
    422: Invalid,
    429: Unavailable,
}


def error_class(status: int) -> type[KubeError]:
    """The error class for an HTTP status."""
    if status >= 500:
        return Unavailable
    return _BY_STATUS.get(status, KubeError)


def parse_status(text: str | bytes) -> dict[str, Any]:
    """The `kind: Status` object in an error body, or {} when the body is not one."""
    try:
        body = bounded_json(text, max_bytes=2**20)  # a Status is small; a proxy's page may not be
    except (ValueError, TypeError):
        return {}
    return body if isinstance(body, dict) else {}


def from_status(status: int, body: str | bytes, *, http_reason: str = "",
                retry_after: float | None = None) -> KubeError:
    """The error for an HTTP answer `status` with body `body` (a Status, or anything)."""
    parsed = parse_status(body)
    message = str(parsed.get("message") or "")
    if not message:
        raw = body.decode(errors="replace") if isinstance(body, bytes) else str(body)
        message = raw.strip()[:500] or http_reason or f"HTTP {status}"
    reason = str(parsed.get("reason") or http_reason or "")
    cls = error_class(status)
    if cls is Invalid and _has_cause(parsed, "FieldValueTooLong"):
        cls = TooLarge
    if status == 504 and _has_cause(parsed, "ResourceVersionTooLarge"):
        cls = Gone  # a version this server never had: relist, as for one it forgot
    if cls is Unavailable:
        return Unavailable(message, status=status, reason=reason, retry_after=retry_after)
    return cls(message, status=status, reason=reason)


def _has_cause(status: dict[str, Any], reason: str) -> bool:
    """Whether a Status lists a cause with `reason` in its details."""
    details = status.get("details")
    causes = details.get("causes") if isinstance(details, dict) else None
    return isinstance(causes, list) and any(
        isinstance(c, dict) and c.get("reason") == reason for c in causes)


def from_status_object(obj: dict[str, Any]) -> KubeError:
    """The error for a Status object received inside a stream (a watch ERROR event)."""
    code = obj.get("code")
    status = code if isinstance(code, int) else 500
    return from_status(status, json.dumps(obj))
