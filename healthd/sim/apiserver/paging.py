"""Paginated lists (`limit` and `continue`) as the real API server serves them.

A list with `limit` answers at most that many objects and, when more follow,
`metadata.continue`: an opaque token (base64 of JSON naming the list's revision and
the last key served, the real server's layout) that asks for the next page, of the
same revision, so the pages add up to one consistent list; `remainingItemCount` says
how many follow when no selector filters the list. A token whose revision the
history no longer holds (compaction) is refused with 410 `Expired`, and the client
lists again from the start (the real server also offers a token for an inconsistent
remainder; healthd never takes it, so the emulator does not offer one). A token
beside a `resourceVersion`, or one that does not decode, is a 400.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from healthd.sim.apiserver.errors import ApiError
from healthd.sim.apiserver.store import Page

UNLIMITED = 1 << 62
_VERSION = "meta.k8s.io/v1"
EXPIRED_MESSAGE = (
    "The provided continue parameter is too old to display a consistent list result. "
    "You can start a new list without the continue parameter.")


def token_of(page: Page) -> str:
    """The continue token that asks for what follows `page.last` at `page.rv`."""
    body = {"v": _VERSION, "rv": page.rv, "start": [page.last[0], page.last[1]]}
    return base64.urlsafe_b64encode(json.dumps(body).encode()).decode().rstrip("=")


def start_of(query: dict[str, str]) -> Page | None:
    """Where the page asked for by `query` starts (None: a first page)."""
    token = query.get("continue")
    if not token:
        return None
    if query.get("resourceVersion"):
        raise ApiError.bad_request(
            "specifying resource version is not allowed when using continue")
    try:
        body = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        namespace, name = body["start"]
        if body.get("v") != _VERSION or not isinstance(body["rv"], int):
            raise ValueError(body)
        return Page(body["rv"], (str(namespace), str(name)))
    except (binascii.Error, ValueError, KeyError, TypeError):
        raise ApiError.bad_request("continue key is not valid") from None


def expired() -> ApiError:
    return ApiError(410, EXPIRED_MESSAGE, "Expired")


def list_meta(rv: int, following: Page | None, rest: int, *, counted: bool) -> dict[str, Any]:
    """A page's `metadata`: its revision, and the token and count of what follows."""
    meta: dict[str, Any] = {"resourceVersion": str(rv)}
    if following is not None:
        meta["continue"] = token_of(following)
        if counted:
            meta["remainingItemCount"] = rest
    return meta
