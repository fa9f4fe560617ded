"""The theoretical PCIe rate table against published per-direction figures."""

from __future__ import annotations

import pytest

from checks.pciebw import link_rate_gbps


@pytest.mark.parametrize(
    ("gen", "width", "published_gbps"),
    [
        (1, 1, 0.25),
        (1, 16, 4.0),
        (2, 1, 0.5),
        (2, 16, 8.0),
        (3, 1, 0.985),
        (3, 8, 7.88),
        (3, 16, 15.75),
        (4, 4, 7.88),
        (4, 16, 31.5),
        (5, 1, 3.94),
        (5, 8, 31.5),
        (5, 16, 63.0),
        (6, 16, 128.0),
    ],
)
def test_rate_matches_published_figure(gen: int, width: int, published_gbps: float) -> None:
    assert link_rate_gbps(gen, width) == pytest.approx(published_gbps, rel=0.005)


@pytest.mark.parametrize(("gen", "width"), [(0, 16), (9, 16), (4, 0), (5, -1)])
def test_a_link_that_cannot_exist_is_refused(gen: int, width: int) -> None:
    with pytest.raises(ValueError, match="PCIe"):
        link_rate_gbps(gen, width)
