"""Kubernetes resource quantities (`8`, `500m`, `2000G`, `128Gi`, `1e3`) as exact Decimals.

Lending arithmetic (`nominalQuota - unavailable`) mixes values written in different
units; floats would turn `2000G - 512Gi` into something the server does not accept
back. Parsing follows the apimachinery grammar; formatting keeps the unit of the
value it replaces where that is exact (`nominalQuota: 2000G` gives `1488G`), else
falls back to plain units or milli-units, rounding down (a lendingLimit may only err
on the side of lending less).
"""

from __future__ import annotations

import functools
import re
from decimal import ROUND_FLOOR, Decimal, InvalidOperation

Quantity = Decimal

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
            "k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"),
            "P": Decimal("1e15"), "E": Decimal("1e18")}
_QUANTITY = re.compile(
    r"^([+-]?(?:\d+(?:\.\d*)?|\.\d+))"  # number
    r"(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?$"  # suffix: binary, decimal or exponent
)
_MILLI = Decimal("0.001")


def _multiplier(suffix: str) -> Decimal:
    if suffix in _BINARY:
        return Decimal(_BINARY[suffix])
    if suffix in _DECIMAL:
        return _DECIMAL[suffix]
    return Decimal(10) ** int(suffix[1:])  # exponent form: e3, E-2


def _split(text: str) -> tuple[Decimal, str]:
    match = _QUANTITY.match(text.strip())
    if match is None:
        raise ValueError(f"not a Kubernetes quantity: {text!r}")
    try:
        return Decimal(match.group(1)), match.group(2) or ""
    except InvalidOperation as exc:
        raise ValueError(f"not a Kubernetes quantity: {text!r}") from exc


def parse_quantity(text: str | int) -> Decimal:
    """The exact value of a quantity (`"2000G"` -> 2000000000000). ValueError on garbage."""
    if isinstance(text, bool):
        raise ValueError(f"not a Kubernetes quantity: {text!r}")
    if isinstance(text, int):
        return Decimal(text)
    if not isinstance(text, str):
        raise ValueError(f"not a Kubernetes quantity: {text!r}")
    return _parse_text(text)


@functools.lru_cache(maxsize=4096)
def _parse_text(text: str) -> Decimal:
    # A fleet repeats a handful of spellings ("8", "512Gi"): parse each once.
    number, suffix = _split(text)
    return number * _multiplier(suffix)


def try_quantity(text: object) -> Decimal | None:
    """`parse_quantity`, or None for anything that is not a quantity."""
    if not isinstance(text, str | int):
        return None
    try:
        return parse_quantity(text)
    except ValueError:
        return None


def _suffix_of(like: str) -> str:
    try:
        suffix = _split(like)[1]
    except ValueError:
        return ""
    return "" if suffix[:1] in ("e", "E") else suffix


def _whole(value: Decimal) -> bool:
    return value == value.to_integral_value()


def format_quantity(value: Decimal, like: str = "") -> str:
    """`value` written as a quantity, in `like`'s unit when that is exact.

    `format_quantity(Decimal(4), "8")` -> `"4"`; `(Decimal("1.488e12"), "2000G")` ->
    `"1488G"`; `(Decimal("0.5"), "2")` -> `"500m"`. Anything finer than a milli-unit
    is rounded down to one.
    """
    if value == 0:
        return "0"
    suffix = _suffix_of(like)
    scaled = value / _multiplier(suffix)
    if suffix and _whole(scaled):
        return f"{int(scaled)}{suffix}"
    if _whole(value):
        return str(int(value))
    milli = (value / _MILLI).to_integral_value(rounding=ROUND_FLOOR)
    return f"{int(milli)}m" if milli else "0"
