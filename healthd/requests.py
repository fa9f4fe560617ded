"""On-demand requests by annotation: reading them, taking each exactly once, answering.

The format is shared: the agent serves requests, `healthd trigger` writes and
watches them.

Admins (or `healthd trigger`) ask for checks by writing `healthd.io/run` (`all`,
`pciebw,remapped`, `dcgm:3`) or `healthd.io/clear=true` on the Node, optionally with
`healthd.io/run-id`: the id of the run, or of a clear written without a run. The
agent sees them on its node watch:

- `read_requests` parses them (pure): a malformed value, an unknown check or an
  argument its check rejects (`dcgm:9`) becomes `Request.error`, never an exception;
- `take` removes a request with a JSON patch whose `test` guards the value that was
  read, so a request is consumed once and a newer one written meanwhile is never
  lost (the test fails and the caller re-reads); the same patch may write what the
  agent keeps of the request while it runs (a clear's `healthd.io/clearing`);
- `answer` builds the `healthd.io/last-run` JSON (healthd.published.LastRun).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from pydantic import ValidationError

from checks.base import BaseCheck
from healthd.config.selection import Selected, SelectionError, parse_selection
from healthd.kube.conventions import Keys, Verdict
from healthd.kube.errors import Invalid, KubeError, NotFound
from healthd.kube.objects import meta, resource_version_of
from healthd.published import LastRun
from healthd.util.times import rfc3339

log = logging.getLogger(__name__)

ERROR_CHARS = 1000  # an error in last-run stays readable and bounded
ECHO_CHARS = 256  # how much of a request's text (and id) an answer, log or Event repeats


@dataclass(frozen=True)
class Request:
    """One on-demand request as read from the node. `error` non-empty: refuse it.

    `annotation` is the key it came from; `explicit_id` says the id came from
    `healthd.io/run-id` (which `take` then removes too)."""

    id: str
    text: str
    kind: Literal["run", "clear"]
    selected: list[Selected] = field(default_factory=list)
    error: str = ""
    annotation: str = ""
    explicit_id: bool = False

    @property
    def ok(self) -> bool:
        return not self.error

    @property
    def shown(self) -> str:
        """The request's text as answers, logs and Events repeat it: at most
        ECHO_CHARS characters (a request is whatever someone wrote, of any size)."""
        return _clip(self.text, ECHO_CHARS)


def read_requests(
    node_obj: dict[str, Any], keys: Keys, registry: Mapping[str, type[BaseCheck]]
) -> list[Request]:
    """The clear and run requests on the node, in that order (none: empty list): a run
    written with a clear checks the node after the clear released what it could (the
    controller's validation after a repair relies on it)."""
    annotations = meta(node_obj).get("annotations")
    if not isinstance(annotations, dict):
        return []
    version = resource_version_of(node_obj) or ""
    out: list[Request] = []
    if keys.clear in annotations:
        out.append(_clear_request(annotations, keys, version))
    if keys.run in annotations:
        out.append(_run_request(annotations, keys, registry, version))
    return out


def _run_request(annotations: Mapping[str, Any], keys: Keys,
                 registry: Mapping[str, type[BaseCheck]], version: str) -> Request:
    text = str(annotations[keys.run])
    given = annotations.get(keys.run_id)
    request_id = str(given) if given else derived_id("run", version, text)
    try:
        selected = parse_selection(text, registry)
        error = _argument_error(selected, registry)
    except SelectionError as exc:
        selected, error = [], str(exc)
    return Request(request_id, text, "run", selected if not error else [], error,
                   annotation=keys.run, explicit_id=bool(given))


def _clear_request(annotations: Mapping[str, Any], keys: Keys, version: str) -> Request:
    """The clear; `run-id` is its id when no run is written with it (with one, the id
    is the run's: the controller's validation writes a clear, a run and the run's id)."""
    text = str(annotations[keys.clear])
    error = "" if text.strip().lower() == "true" else (
        f"{keys.clear} must be true (got {text!r})")
    given = annotations.get(keys.run_id) if keys.run not in annotations else None
    request_id = str(given) if given else derived_id("clear", version, text)
    return Request(request_id, text, "clear", [], error, annotation=keys.clear,
                   explicit_id=bool(given))


def derived_id(kind: str, resource_version: str, text: str) -> str:
    """A stable id for a request written without `run-id`: the same node version and
    value always give the same id."""
    digest = hashlib.sha256(f"{kind}\0{resource_version}\0{text}".encode()).hexdigest()
    return f"{kind}-{digest[:12]}"


def _argument_error(selected: list[Selected], registry: Mapping[str, type[BaseCheck]]) -> str:
    """Validate each `name:arg` with its check's Params (`dcgm:9`: level must be 1..4)."""
    for item in selected:
        cls = registry[item.name]
        if item.arg is None or cls.ARG is None:
            continue
        try:
            cls.Params.model_validate({cls.ARG: item.arg})
        except ValidationError as exc:
            problems = "; ".join(e["msg"] for e in exc.errors())
            return f"bad argument in {item}: {cls.ARG}={item.arg!r}: {problems}"
    return ""


def pointer(key: str, field: str = "annotations") -> str:
    """The JSON pointer to annotation `key` (or to label `key`, with field "labels";
    RFC 6901: `~` -> `~0`, `/` -> `~1`)."""
    return f"/metadata/{field}/" + key.replace("~", "~0").replace("/", "~1")


def take_ops(request: Request, keys: Keys,
             also: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """JSON-patch ops that remove the request only if it still reads the same, and
    set the annotations `also` in the same write."""
    key = request.annotation or (keys.run if request.kind == "run" else keys.clear)
    guarded = [(key, request.text)]
    if request.explicit_id:
        guarded.append((keys.run_id, request.id))
    ops: list[dict[str, Any]] = []
    for name, value in guarded:
        ops.append({"op": "test", "path": pointer(name), "value": value})
        ops.append({"op": "remove", "path": pointer(name)})
    ops += [{"op": "add", "path": pointer(name), "value": value}
            for name, value in (also or {}).items()]
    return ops


class NodePatcher(Protocol):
    """What `take` needs: a JSON patch on the node (the agent's node publisher)."""

    async def patch_annotations(self, ops: list[dict[str, Any]]) -> dict[str, Any]: ...


async def take(publisher: NodePatcher, request: Request, keys: Keys,
               also: Mapping[str, str] | None = None) -> bool:
    """Consume `request`, writing the annotations `also` with it: True when it was
    removed by this call. False when it changed meanwhile (a newer request is on the
    node: re-read it) or the server cannot be reached now (the request stays on the
    node and the next node event retries)."""
    try:
        await publisher.patch_annotations(take_ops(request, keys, also))
    except (Invalid, NotFound):
        return False
    except KubeError as exc:
        log.warning("cannot take request %s: %s", request.id, exc,
                    extra={"request_id": request.id})
        return False
    return True


def answer(
    request: Request,
    *,
    accepted: bool,
    error: str,
    start: float,
    end: float,
    verdict: Verdict,
    checks: Mapping[str, str],
    reasons: Mapping[str, str] | None = None,
) -> str:
    """The `healthd.io/last-run` JSON: id, request, accepted or error, times, verdict,
    per-check status, and why each check that could not tell (UNKNOWN) could not."""
    return LastRun(
        id=_clip(request.id, ECHO_CHARS),
        request=request.shown,
        kind=request.kind,
        accepted=accepted,
        error=_clip(error),
        start=rfc3339(start),
        end=rfc3339(end),
        duration_s=round(max(0.0, end - start), 3),  # the times above are whole seconds
        verdict=verdict.value,
        checks={str(k): str(v) for k, v in checks.items()},
        reasons={str(k): _clip(str(v)) for k, v in (reasons or {}).items()},
        # say so when the answer repeats only the request's start
        request_chars=len(request.text) if len(request.text) > ECHO_CHARS else None,
    ).encode()


def _clip(text: str, limit: int = ERROR_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
