"""Which checks to run: parsing `all`, `pciebw,remapped`, `dcgm:3`.

The same text appears on the command line (`healthd check --checks`) and in the
on-demand annotation (`healthd.io/run`), so both parse it here, with one set of
error messages.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from checks.base import BaseCheck

_ITEM = re.compile(r"^(?P<name>[a-z][a-z0-9_-]*)(?::(?P<arg>[A-Za-z0-9_.-]+))?$")


@dataclass(frozen=True)
class Selected:
    """One check asked for, with its optional argument (`dcgm:3` -> ("dcgm", "3"))."""

    name: str
    arg: str | None = None

    def __str__(self) -> str:
        return self.name if self.arg is None else f"{self.name}:{self.arg}"


class SelectionError(ValueError):
    """A check list that cannot be run; the message says what is wrong and what is known."""


class UnknownCheck(SelectionError):
    def __init__(self, names: Iterable[str], known: Iterable[str]) -> None:
        self.names = sorted(set(names))
        self.known = sorted(known)
        plural = "s" if len(self.names) > 1 else ""
        super().__init__(
            f"unknown check{plural} {', '.join(self.names)}; known checks: {', '.join(self.known)}"
        )


def default_selection(registry: Mapping[str, type[BaseCheck]]) -> list[Selected]:
    """`all`: every check whose default instance is not exclusive, in registry order."""
    return [Selected(name) for name, cls in registry.items() if not cls().exclusive]


def parse_selection(text: str, registry: Mapping[str, type[BaseCheck]]) -> list[Selected]:
    """Parse a comma-separated check list. `all` (alone) means the default set."""
    items = [part.strip() for part in text.split(",")]
    if not text.strip() or any(not part for part in items):
        raise SelectionError(f"empty check name in {text!r}: write e.g. `remapped,power` or `all`")
    if items == ["all"]:
        return default_selection(registry)
    selected: list[Selected] = []
    unknown: list[str] = []
    for part in items:
        match = _ITEM.match(part)
        if match is None:
            raise SelectionError(f"malformed check {part!r}: expected NAME or NAME:ARG")
        name, arg = match["name"], match["arg"]
        if name == "all":
            raise SelectionError("`all` cannot be combined with other checks")
        if name not in registry:
            unknown.append(name)
            continue
        if arg is not None and registry[name].ARG is None:
            raise SelectionError(f"check {name} takes no argument (got {part!r})")
        if Selected(name, arg) not in selected:
            selected.append(Selected(name, arg))
    if unknown:
        raise UnknownCheck(unknown, registry)
    return selected
