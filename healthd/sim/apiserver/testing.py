"""Pytest fixtures that give any test folder an emulator.

In a folder's `conftest.py`::

    from healthd.sim.apiserver.testing import api, sync_api  # noqa: F401

then `async def test_x(api)` (an `ApiEmulator` on the test's loop; the module needs
`pytestmark = pytest.mark.anyio`) or `def test_y(sync_api)` (a `ThreadedEmulator`
for sync code). Each test gets a fresh, empty server.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from healthd.sim.apiserver.emulator import ApiEmulator, ThreadedEmulator


@pytest.fixture
async def api() -> AsyncIterator[ApiEmulator]:
    """A fresh emulator on the test's event loop."""
    async with ApiEmulator() as emulator:
        yield emulator


@pytest.fixture
def sync_api() -> Iterator[ThreadedEmulator]:
    """A fresh emulator on a background thread, for sync code."""
    with ApiEmulator.in_thread() as emulator:
        yield emulator
