"""Fixtures for the observability tests: the Prometheus tools (skipped visibly when the
Debian `prometheus` package is missing) and one live scenario shared by the folder."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from tests.observe.scenario import HANG_S, Live, running_scenario

MISSING = "needs the Debian package `prometheus` ({}) on PATH: apt-get install prometheus"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The scenario waits for what it needs, however long a loaded machine takes; its
    own guard against a hang, which says what it awaited, must end it before the
    test timeout does (the first test to use it sets it up)."""
    for item in items:
        if "live" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.timeout(HANG_S + 60))


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(MISSING.format(name))
    return path


@pytest.fixture(scope="session")
def promtool() -> str:
    return _binary("promtool")


@pytest.fixture(scope="session")
def prometheus_bin() -> str:
    return _binary("prometheus")


@pytest.fixture(scope="session")
def live(prometheus_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """A real Prometheus scraping real agents and a real controller (scenario.py)."""
    with running_scenario(tmp_path_factory.mktemp("observe"), prometheus_bin) as scenario:
        yield scenario
