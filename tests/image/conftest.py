"""Every test here that builds or runs healthd's image (the `image` fixture,
tests/image/fixture.py) is marked `image` (deselect with `-m "not image"`)."""

from __future__ import annotations

import pytest

IMAGE_TIMEOUT_S = 1500  # the first test of a cold machine waits for the build


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/image/" in str(item.path).replace("\\", "/") and "image" in getattr(
                item, "fixturenames", ()):
            item.add_marker(pytest.mark.image)
            item.add_marker(pytest.mark.timeout(IMAGE_TIMEOUT_S))
