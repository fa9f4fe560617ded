"""Parsing check lists: the command line and the on-demand annotation share it."""

from __future__ import annotations

import pytest

import checks
from healthd.config.selection import Selected, SelectionError, UnknownCheck, parse_selection

R = checks.REGISTRY


def test_all_is_every_non_exclusive_check() -> None:
    names = [s.name for s in parse_selection("all", R)]
    assert names == [n for n, cls in R.items() if not cls().exclusive]
    assert {"remapped", "power", "pcie", "ecc", "nvlink", "gpus", "xid"} <= set(names)


def test_list_and_argument() -> None:
    assert parse_selection("pciebw, remapped,dcgm:3", R) == [
        Selected("pciebw"),
        Selected("remapped"),
        Selected("dcgm", "3"),
    ]


def test_unknown_names_are_listed_with_the_known_ones() -> None:
    with pytest.raises(UnknownCheck) as err:
        parse_selection("remapped,foo,bar", R)
    assert err.value.names == ["bar", "foo"]
    assert "known checks: " in str(err.value) and "remapped" in str(err.value)


@pytest.mark.parametrize(
    "text", ["", "remapped,", "all,remapped", "remapped:3", "dcgm:", "DCGM", "dcgm:3;rm -rf"]
)
def test_malformed(text: str) -> None:
    with pytest.raises(SelectionError):
        parse_selection(text, R)
