"""The few validation rules of the real API server that product code can meet.

The emulator does no schema validation; it refuses what a real server refuses where
healthd's own writes could be refused: annotations past 256 KiB together, and an
Event's namespace rules and required fields (an Event about a Node lives in
`default`, one about a namespaced object in that object's namespace). Messages,
reasons and causes are the real server's (Kubernetes 1.35), so code that reads
them behaves the same on both.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from healthd.sim.apiserver.errors import ApiError
from healthd.sim.apiserver.resources import Obj, ResourceType

ANNOTATIONS_LIMIT = 256 * 1024  # bytes of all keys and values together
_EVENT_TEXT_LIMIT = 128  # reportingInstance, action, reason
_EVENT_NOTE_LIMIT = 1024
_MICRO_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}(Z|[+-]\d\d:\d\d)")
_MICRO_LAYOUT = "2006-01-02T15:04:05.000000Z07:00"
_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_QUALIFIED_RULE = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
    "with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex "
    "used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')")


@dataclass(frozen=True)
class FieldError:
    """One cause: `field: detail`, as the real server's field.Error prints it."""

    field: str
    reason: str  # FieldValueInvalid, FieldValueRequired, FieldValueTooLong
    detail: str

    @classmethod
    def invalid(cls, path: str, value: object, why: str) -> FieldError:
        return cls(path, "FieldValueInvalid", f'Invalid value: "{value}": {why}')

    @classmethod
    def required(cls, path: str) -> FieldError:
        return cls(path, "FieldValueRequired", "Required value")


def refuse(rt: ResourceType, obj: Obj, errors: list[FieldError]) -> None:
    """422 Invalid naming every error, as the real server words it; nothing if none."""
    if not errors:
        return
    name = str((obj.get("metadata") or {}).get("name") or "")
    texts = [f"{e.field}: {e.detail}" for e in errors]
    listed = texts[0] if len(texts) == 1 else f"[{', '.join(texts)}]"
    details: Obj = {"name": name, "kind": rt.kind,
                    "causes": [{"reason": e.reason, "message": e.detail, "field": e.field}
                               for e in errors]}
    if rt.group:
        details["group"] = rt.group
    raise ApiError(422, f'{rt.kind} "{name}" is invalid: {listed}', "Invalid", details)


def annotation_errors(obj: Obj) -> list[FieldError]:
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    size = sum(len(str(k).encode()) + len(str(v).encode()) for k, v in annotations.items())
    if size <= ANNOTATIONS_LIMIT:
        return []
    return [FieldError("metadata.annotations", "FieldValueTooLong",
                       f"Too long: may not be more than {ANNOTATIONS_LIMIT} bytes")]


def check_event_time(rt: ResourceType, obj: Obj) -> None:
    """400, as the real server's decoder: eventTime is a MicroTime, six digits after
    the seconds (a client that sends `...:00+00:00` is refused before validation)."""
    when = obj.get("eventTime")
    if when is None or _MICRO_TIME.fullmatch(str(when)):
        return
    raise ApiError.bad_request(
        f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: '
        f'parsing time "{when}" as "{_MICRO_LAYOUT}"')


def event_errors(rt: ResourceType, obj: Obj, *, creating: bool) -> list[FieldError]:
    """The real server's Event rules for `obj` (storage shape, i.e. core v1 field
    names) written through `rt` (core v1 or events.k8s.io/v1). Updates through
    events.k8s.io/v1 also keep most fields immutable there: not emulated."""
    errors = _namespace_errors(obj)
    if obj.get("eventTime"):
        errors += _reporting_errors(rt, obj)
    if creating and rt.group == "events.k8s.io":
        errors += _strict_errors(obj)
    return errors


def _namespace_errors(obj: Obj) -> list[FieldError]:
    """An Event lives in its object's namespace; one about a cluster-scoped object
    (no involvedObject.namespace) in `default` (or kube-system, for new-style ones)."""
    namespace = str((obj.get("metadata") or {}).get("namespace") or "")
    involved = str((obj.get("involvedObject") or {}).get("namespace") or "")
    if not obj.get("eventTime"):
        fits = namespace == involved if involved else namespace in ("", "default")
    else:
        fits = bool(involved) or namespace in ("default", "kube-system")
    if fits:
        return []
    return [FieldError.invalid("involvedObject.namespace", involved,
                               "does not match event.namespace")]


def _reporting_errors(rt: ResourceType, obj: Obj) -> list[FieldError]:
    """New-style Events (with eventTime) name who reported what, in this order."""
    controller = "reportingController" if rt.group else "reportingComponent"
    value = str(obj.get("reportingComponent") or "")
    errors = [FieldError.required(controller)] if not value else []
    errors += [FieldError.invalid(controller, value, why) for why in _qualified_name(value)]
    for path in ("reportingInstance", "action", "reason"):
        text = str(obj.get(path) or "")
        if not text:
            errors.append(FieldError.required(path))
        elif len(text) > _EVENT_TEXT_LIMIT:
            errors.append(FieldError.invalid(
                path, "", f"can have at most {_EVENT_TEXT_LIMIT} characters"))
    if len(str(obj.get("message") or "")) > _EVENT_NOTE_LIMIT:
        errors.append(FieldError.invalid("message", "",
                                         f"can have at most {_EVENT_NOTE_LIMIT} characters"))
    return errors


def _qualified_name(value: str) -> list[str]:
    """The name part of the real server's qualified-name check (`prefix/name`); the
    prefix's DNS rules are not emulated."""
    parts = value.split("/")
    if len(parts) > 2:
        return [f"a qualified name {_QUALIFIED_RULE} with an optional DNS subdomain prefix "
                "and '/' (e.g. 'example.com/MyName')"]
    if len(parts) == 2 and not parts[0]:
        return ["prefix part must be non-empty"]
    name = parts[-1]
    out = ["name part must be non-empty"] if not name else []
    if len(name) > 63:
        out.append("name part must be no more than 63 characters")
    if not _QUALIFIED_NAME.fullmatch(name):
        out.append(f"name part {_QUALIFIED_RULE}")
    return out


def _strict_errors(obj: Obj) -> list[FieldError]:
    """events.k8s.io/v1 creates: eventTime, a known type, no deprecated fields."""
    errors: list[FieldError] = []
    if not obj.get("eventTime"):
        errors.append(FieldError.required("eventTime"))
    if obj.get("type") not in ("Normal", "Warning"):
        errors.append(FieldError.invalid("type", "", f"has invalid value: {obj.get('type')}"))
    source = obj.get("source") or {}
    for path in ("firstTimestamp", "lastTimestamp", "count", "source"):
        if (any(source.values()) if path == "source" else obj.get(path)):
            errors.append(FieldError.invalid(path, "", "needs to be unset"))
    return errors
