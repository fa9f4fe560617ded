"""Fixtures for the lending tests: an emulator per test and a `Kube` talking to it over
real HTTP through the official client. Builders and the running stack: `helpers.py`."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from healthd.kube.client import Kube
from healthd.sim.apiserver import ApiEmulator
from healthd.sim.apiserver.testing import api  # noqa: F401


@pytest.fixture
async def kube(api: ApiEmulator) -> AsyncIterator[Kube]:  # noqa: F811
    async with Kube(api.async_client(), timeout_s=2) as client:
        yield client
