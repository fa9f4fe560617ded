"""API errors and the `kind: Status` bodies the real server answers with.

Every failure inside the emulator is an `ApiError`; the HTTP layer turns it into the
status code and Status object the official client parses into `ApiException`.
"""

from __future__ import annotations

from typing import Any

_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


def status_body(code: int, message: str, reason: str | None = None,
                details: dict[str, Any] | None = None) -> dict[str, Any]:
    """A `kind: Status` failure object."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason or _REASONS.get(code, ""),
        "code": code,
    }
    if details:
        body["details"] = details
    return body


class ApiError(Exception):
    """A request the real server would refuse, with the Status it would send."""

    def __init__(self, code: int, message: str, reason: str | None = None,
                 details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.body = status_body(code, message, reason, details)

    @classmethod
    def bad_request(cls, message: str, reason: str | None = None) -> ApiError:
        return cls(400, message, reason)

    @classmethod
    def not_found(cls, resource: str, name: str, group: str = "") -> ApiError:
        what = f"{resource}.{group}" if group else resource
        return cls(404, f'{what} "{name}" not found', "NotFound",
                   {"name": name, "group": group, "kind": resource})

    @classmethod
    def already_exists(cls, resource: str, name: str, group: str = "") -> ApiError:
        what = f"{resource}.{group}" if group else resource
        return cls(409, f'{what} "{name}" already exists', "AlreadyExists",
                   {"name": name, "group": group, "kind": resource})

    @classmethod
    def conflict(cls, resource: str, name: str, group: str = "") -> ApiError:
        what = f"{resource}.{group}" if group else resource
        return cls(409, f'Operation cannot be fulfilled on {what} "{name}": the object has '
                   "been modified; please apply your changes to the latest version and try "
                   "again", "Conflict", {"name": name, "group": group, "kind": resource})

    @classmethod
    def invalid(cls, message: str) -> ApiError:
        return cls(422, message, "Invalid")
