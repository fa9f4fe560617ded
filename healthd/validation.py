"""How a pydantic validation error reads to a person: `field.path: what is wrong`,
one clause per problem. Config files, machine specs and demo scenarios all say it
this way."""

from __future__ import annotations

from pydantic import ValidationError


def explain(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"])
        message = err["msg"].removeprefix("Value error, ")
        parts.append(f"{where}: {message}" if where else message)
    return "; ".join(parts)
