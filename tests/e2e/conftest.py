"""End-to-end tests on the real control plane: every test here is marked e2e and gets
`healthd`, healthd installed from its manifests on that cluster, with GPU nodes and
processes of its own that are removed afterwards."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.healthd import Healthd, healthd_on
from tests.e2e.mlbatch import documented_operator_autopilot
from tests.realcluster import addons
from tests.realcluster.cluster import ControlPlane

E2E_TIMEOUT_S = 300  # a story on real programs waits on their own clocks (60 s requeues)


# The repair stories run last, (a) first. Run after the other three (their GPU-reset
# Jobs, reboot CRDs and nodes in hardware inspection), (a)'s AppWrapper was twice not
# Running on the healthy node within its minute, though the repair itself passed;
# alone, and first, it passes.
REPAIR_FILES = ("test_repairs.py", "test_repair_guards.py", "test_repair_leader.py",
                "test_repair_reboots.py", "test_repair_operands.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/e2e/" in str(item.path).replace("\\", "/"):
            item.add_marker(pytest.mark.e2e)
            item.add_marker(pytest.mark.timeout(E2E_TIMEOUT_S))
    last = sorted((i for i in items if i.path.name in REPAIR_FILES),
                  key=lambda i: REPAIR_FILES.index(i.path.name))
    items[:] = [i for i in items if i.path.name not in REPAIR_FILES] + last


@pytest.fixture
def healthd(e2e_kubeconfig: Path, tmp_path: Path) -> Iterator[Healthd]:
    with healthd_on(e2e_kubeconfig, tmp_path) as installed:
        installed.install()
        yield installed


class Operator:
    """The real AppWrapper operator of the session's control plane, reconfigured (and
    restarted, as a ConfigMap change needs) only when a test asks for other settings."""

    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane

    def configure(self, **autopilot: object) -> None:
        config = addons.appwrapper_config(**autopilot)
        if config != self.plane.appwrapper_config:
            self.plane.appwrapper_config = config
            addons.start_appwrapper(self.plane)


@pytest.fixture
def local_plane(request: pytest.FixtureRequest) -> ControlPlane:
    """The session's own control plane, for tests that restart its parts or reconfigure
    its operator (not a cluster KUBECONFIG names)."""
    if os.environ.get("KUBECONFIG"):
        pytest.skip("restarts or reconfigures the control plane: runs on the local one only")
    plane: ControlPlane = request.getfixturevalue("realcluster")
    return plane


@pytest.fixture
def operator(local_plane: ControlPlane) -> Operator:
    """The operator configured as the docs tell an SRE to run it beside healthd."""
    running = Operator(local_plane)
    running.configure(**documented_operator_autopilot())
    return running
