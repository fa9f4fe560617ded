"""Shared test set-up: the anyio backend, and visible skips for tests that need root,
a real GPU; the real control plane's and the image's fixtures."""

from __future__ import annotations

import os
import shutil

import pytest
from hypothesis import settings

# healthd's image built with podman, for the tests that run it: see tests/image.
from tests.image.fixture import image  # noqa: F401

# The real control plane (kube-apiserver, etcd, kwok, Kueue, the AppWrapper operator),
# for every test marked e2e: see tests/realcluster.
from tests.realcluster.fixture import e2e_kubeconfig, realcluster  # noqa: F401

# Timing goals are measured in bench/, never asserted: a property that held must not fail
# because a loaded machine ran one example slowly (hypothesis's default 200 ms deadline).
settings.register_profile("healthd", deadline=None)
settings.load_profile("healthd")


@pytest.fixture
def anyio_backend() -> str:
    # The daemons run on asyncio (APScheduler 3, aiohttp, kubernetes.aio).
    return "asyncio"


def gpu_present() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except Exception:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    is_root = os.geteuid() == 0
    has_gpu = None
    for item in items:
        if "root" in item.keywords and not is_root:
            item.add_marker(pytest.mark.skip(reason="needs root (network namespaces, raw sockets)"))
        if "gpu" in item.keywords:
            if has_gpu is None:
                has_gpu = gpu_present()
            if not has_gpu:
                item.add_marker(pytest.mark.skip(reason="needs a real NVIDIA GPU and driver"))


def require_binary(name: str) -> str:
    """Path of a binary the test needs, or a visible skip naming the Debian package."""
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"needs `{name}` on PATH (install it: the README test command does, as root)")
    return path
