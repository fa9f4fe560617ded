"""Label and field selectors: parsing the query strings and matching objects.

Label selectors support the whole set-based grammar the real server accepts
(`=`, `==`, `!=`, `in (...)`, `notin (...)`, `key`, `!key`). Field selectors
support `=`, `==` and `!=` on the labels each resource declares; any other label is
a 400, as on the real server, so product code cannot rely on a filter a cluster
would refuse.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from healthd.sim.apiserver.errors import ApiError
from healthd.sim.apiserver.resources import Obj, ResourceType, get_field


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!exists"
    values: frozenset[str] = frozenset()

    def matches(self, labels: dict[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        checks: dict[str, Callable[[], bool]] = {
            "=": lambda: present and value in self.values,
            "in": lambda: present and value in self.values,
            "!=": lambda: not present or value not in self.values,
            "notin": lambda: not present or value not in self.values,
            "exists": lambda: present,
            "!exists": lambda: not present,
        }
        return checks[self.op]()


_SET_RE = re.compile(r"^\s*([^\s!=(),]+)\s+(in|notin)\s+\(([^()]*)\)\s*$")
_EQ_RE = re.compile(r"^\s*([^\s!=(),]+)\s*(==|!=|=)\s*([^\s!=(),]*)\s*$")
_EXISTS_RE = re.compile(r"^\s*(!?)\s*([^\s!=(),]+)\s*$")


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside `( ... )`."""
    parts, depth, current = [], 0, ""
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [p for p in parts if p.strip()]


def _parse_requirement(text: str) -> Requirement:
    if match := _SET_RE.match(text):
        values = frozenset(v.strip() for v in match.group(3).split(",") if v.strip())
        return Requirement(match.group(1), match.group(2), values)
    if match := _EQ_RE.match(text):
        op = "!=" if match.group(2) == "!=" else "="
        return Requirement(match.group(1), op, frozenset({match.group(3)}))
    if match := _EXISTS_RE.match(text):
        return Requirement(match.group(2), "!exists" if match.group(1) else "exists")
    raise ApiError.bad_request(f"unable to parse requirement: {text.strip()!r}")


def parse_label_selector(text: str | None) -> list[Requirement]:
    """Requirements of a `labelSelector` query value (400 on a syntax error)."""
    if not text:
        return []
    return [_parse_requirement(part) for part in _split_top_level(text)]


def parse_field_selector(text: str | None, rt: ResourceType) -> list[Requirement]:
    """Requirements of a `fieldSelector` value; unknown field labels are a 400."""
    if not text:
        return []
    out = []
    for part in text.split(","):
        match = _EQ_RE.match(part)
        if not match:
            raise ApiError.bad_request(f"invalid selector: {part!r}; only =, == and != work")
        key = match.group(1)
        if key not in rt.field_labels:
            raise ApiError.bad_request(
                f'field label not supported: {key}', reason="BadRequest")
        op = "!=" if match.group(2) == "!=" else "="
        out.append(Requirement(key, op, frozenset({match.group(3)})))
    return out


def _field_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


@dataclass(frozen=True)
class Selector:
    """Label plus field requirements, matched against stored objects."""

    labels: tuple[Requirement, ...] = ()
    fields: tuple[Requirement, ...] = ()

    @classmethod
    def parse(cls, rt: ResourceType, label_selector: str | None,
              field_selector: str | None) -> Selector:
        return cls(tuple(parse_label_selector(label_selector)),
                   tuple(parse_field_selector(field_selector, rt)))

    def matches(self, obj: Obj) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        if not all(req.matches(labels) for req in self.labels):
            return False
        for req in self.fields:
            value = {req.key: _field_text(get_field(obj, req.key))}
            if not req.matches(value):
                return False
        return True
