"""Kubernetes quantities: parsing every suffix family exactly, refusing garbage, and
writing results back in the unit of the value they replace."""

from __future__ import annotations

from decimal import Decimal

import pytest

from healthd.capacity.quantities import format_quantity, parse_quantity, try_quantity


@pytest.mark.parametrize(("text", "value"), [
    ("8", Decimal(8)),
    (8, Decimal(8)),
    ("500m", Decimal("0.5")),
    ("2000G", Decimal(2 * 10**12)),
    ("128Gi", Decimal(128 * 2**30)),
    ("1Ki", Decimal(1024)),
    ("1e3", Decimal(1000)),
    ("1E-3", Decimal("0.001")),
    ("1.5", Decimal("1.5")),
    ("0.5Gi", Decimal(2**29)),
    ("+3", Decimal(3)),
    ("2E", Decimal(2 * 10**18)),  # E alone is exa, not an exponent
])
def test_parse(text: str | int, value: Decimal) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "x", "8 GPUs", "1.2.3", "Gi", "5Xi", None, True, [], 1.5])
def test_garbage_is_refused(text: object) -> None:
    assert try_quantity(text) is None
    with pytest.raises(ValueError, match="quantity"):
        parse_quantity(text)  # type: ignore[arg-type]


@pytest.mark.parametrize(("value", "like", "text"), [
    (Decimal(4), "8", "4"),
    (Decimal(0), "2000G", "0"),
    (parse_quantity("2000G") - parse_quantity("512G"), "2000G", "1488G"),
    (parse_quantity("2000G") - parse_quantity("512Gi"), "2000G", "1450244186112"),
    (parse_quantity("64Gi"), "128Gi", "64Gi"),
    (Decimal("0.5"), "2", "500m"),
    (Decimal("1.25"), "2000m", "1250m"),
    (Decimal("0.0005"), "1", "0"),  # below a milli-unit: rounded down, never up
    (Decimal("2.0004"), "3", "2000m"),
    (Decimal(6000), "1e4", "6000"),
])
def test_format(value: Decimal, like: str, text: str) -> None:
    assert format_quantity(value, like) == text


@pytest.mark.parametrize("text", ["8", "500m", "2000G", "128Gi", "1450244186112", "3Ti"])
def test_format_round_trips(text: str) -> None:
    assert format_quantity(parse_quantity(text), text) == text
