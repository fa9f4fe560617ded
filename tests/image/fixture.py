"""The `image` pytest fixture: healthd's image for this checkout (tests/image/build.py),
built once per session. Where the machine cannot build it the tests that need it are
skipped with the reason; under CI (`CI=true`) that is a failure instead."""

from __future__ import annotations

import os

import pytest

from tests.image import build

_FAILED: list[str] = []  # one failed build is reported by every test, not retried


def unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"healthd's image is required in CI: {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def image() -> build.Built:
    if _FAILED:
        unavailable(_FAILED[0])
    try:
        built = build.build()
    except build.Unavailable as exc:
        _FAILED.append(f"healthd's image cannot be built here: {exc}")
        unavailable(_FAILED[0])
    print(f"image: {built.describe()}")
    return built
