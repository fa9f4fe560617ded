"""Two builds of the same sources install the same packages, file for file: the locks
pin every version and every wheel's hash, and healthd's own wheel is built from the
sources alone. The second build takes nothing from podman's layer cache."""

from __future__ import annotations

import uuid

from tests.image import build


def test_two_builds_of_the_same_sources_install_the_same_packages(image: build.Built) -> None:
    again = f"{build.REPOSITORY}:again-{uuid.uuid4().hex[:6]}"
    try:
        build.build(force=True, tag=again)
        first, second = build.installed_packages(image.image), build.installed_packages(again)
    finally:
        build.remove(again)
    assert "healthd==0.1.0" in first
    assert len(first) > 30  # healthd and every locked dependency
    assert first == second
