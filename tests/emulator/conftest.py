"""Fixtures for the emulator's contract tests.

`kube` is parametrized over client flavour (sync, async) and target: the emulator,
or the real API server (the session's real control plane, or the cluster KUBECONFIG
names): those twins carry the `e2e` mark. `ekube` is the
same over the emulator only, for tests that need its powers (request log, faults,
direct store access); `emulator` is that test's server.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from healthd.sim.apiserver import ApiEmulator
from tests.emulator.kube import Kube, open_kube

FLAVORS = ["sync", "async"]
TARGETS = ["emulator", pytest.param("cluster", marks=pytest.mark.e2e)]


@pytest.fixture
async def emulator() -> AsyncIterator[ApiEmulator]:
    async with ApiEmulator(bookmark_interval=0.2) as api:
        yield api


@pytest.fixture(params=TARGETS)
async def target(request: pytest.FixtureRequest) -> AsyncIterator[ApiEmulator | Path]:
    """The emulator, or the admin kubeconfig of the real API server (`e2e_kubeconfig`)."""
    if request.param == "cluster":
        yield request.getfixturevalue("e2e_kubeconfig")
        return
    async with ApiEmulator(bookmark_interval=0.2) as api:
        yield api


@pytest.fixture(params=FLAVORS)
async def kube(request: pytest.FixtureRequest, target: ApiEmulator | Path) -> AsyncIterator[Kube]:
    async with open_kube(request.param, target) as k:
        yield k


@pytest.fixture(params=FLAVORS)
async def ekube(request: pytest.FixtureRequest, emulator: ApiEmulator) -> AsyncIterator[Kube]:
    async with open_kube(request.param, emulator) as k:
        yield k
