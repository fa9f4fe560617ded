"""Fixtures for the network tests: a throwaway namespace lab, always cleaned up."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.network.netlab import NetLab


@pytest.fixture
async def netlab(anyio_backend: str) -> AsyncIterator[NetLab]:
    lab = NetLab()
    try:
        yield lab
    finally:
        await lab.close()
