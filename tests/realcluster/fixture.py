"""The `realcluster` and `e2e_kubeconfig` pytest fixtures.

`realcluster` builds (or reuses) the pinned programs and starts one control plane for
the whole session. Where it cannot (no Go, a build or start failure) the tests that
need it are skipped with the reason; under CI (`CI=true`) that is a failure instead,
never a skip. `e2e_kubeconfig` is the admin kubeconfig the e2e tests talk to: the
cluster named by `KUBECONFIG` when set, else the session's real control plane.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.realcluster import programs
from tests.realcluster.cluster import ControlPlane


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def unavailable(reason: str) -> None:
    """Skip the test with `reason`, or fail it under CI."""
    if in_ci():
        pytest.fail(f"the real control plane is required in CI: {reason}", pytrace=False)
    pytest.skip(reason)


_FAILED: list[str] = []  # one start failure is reported by every test, not retried


@pytest.fixture(scope="session")
def realcluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    if _FAILED:
        unavailable(_FAILED[0])
    if programs.go_binary() is None:
        unavailable("needs Go (>= 1.25) on PATH to build the real control plane "
                    "(kube-apiserver, etcd, kwok, Kueue, the AppWrapper operator)")
    plane = ControlPlane(tmp_path_factory.mktemp("realcluster"))
    try:
        plane.start()
    except Exception as exc:  # a build or start failure: say which, with its log
        plane.stop()
        _FAILED.append(f"the real control plane did not start: {exc}")
        unavailable(_FAILED[0])
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def e2e_kubeconfig(request: pytest.FixtureRequest) -> Path:
    external = os.environ.get("KUBECONFIG")
    if external:
        return Path(external)
    plane: ControlPlane = request.getfixturevalue("realcluster")
    return plane.admin_kubeconfig
