"""Which AppWrappers get reset: the pod filters (pending, terminating, CPU-only,
init-container-only, limits-only), the phase filter, `spec.managedBy`, and the
node's verdict, each seen through the emulator and the real client."""

from __future__ import annotations

from typing import Any

import pytest

from healthd.kube.client import Kube
from healthd.kube.conventions import OPERATOR_MANAGER, Verdict
from healthd.sim.apiserver import ApiEmulator
from tests.controller_resets.conftest import (
    NS,
    MakeResetter,
    appwrapper,
    node,
    pod,
    reconcile,
    reset_writes,
    stored_aw,
)

pytestmark = pytest.mark.anyio

POD_CASES = {
    "pending": ({"phase": "Pending"}, False),
    "terminating": ({"terminating": True}, False),
    "cpu-only": ({"requests": {"cpu": "4"}}, False),
    "zero-gpu": ({"requests": {"nvidia.com/gpu": "0", "cpu": "1"}}, False),
    "init-container-only": ({"requests": {"cpu": "1"},
                             "init_requests": {"nvidia.com/gpu": "1"}}, False),
    "succeeded": ({"phase": "Succeeded"}, False),
    "limits-only": ({"limits": {"nvidia.com/gpu": "2"}}, True),
    "requests": ({"requests": {"nvidia.com/gpu": "8"}}, True),
}


@pytest.mark.parametrize("case", list(POD_CASES))
async def test_pod_filter(api: ApiEmulator, kube: Kube, make_resetter: MakeResetter,
                          case: str) -> None:
    pod_args, resets = POD_CASES[case]
    api.seed(node("n1", Verdict.EVICT, "XID_79"), appwrapper("job"),
             pod("job-0", "job", "n1", **pod_args))

    results = await reconcile(kube, make_resetter())

    assert results == ({f"{NS}/job": "reset"} if resets else {})
    assert stored_aw(api, "job")["status"]["phase"] == ("Resetting" if resets else "Running")
    assert len(reset_writes(api)) == (1 if resets else 0)


@pytest.mark.parametrize("phase", ["Resetting", "Resuming", "Suspended", "Suspending",
                                   "Succeeded", "Failed", ""])
async def test_only_running_appwrappers_are_reset(api: ApiEmulator, kube: Kube,
                                                  make_resetter: MakeResetter,
                                                  phase: str) -> None:
    api.seed(node("n1", Verdict.EVICT, "XID_79"), appwrapper("job", phase),
             pod("job-0", "job", "n1"))

    assert await reconcile(kube, make_resetter()) == {}
    assert api.writes() == []


@pytest.mark.parametrize(("managed_by", "resets"), [
    (None, True), (OPERATOR_MANAGER, True), ("kueue.x-k8s.io/multikueue", False)])
async def test_managed_by(api: ApiEmulator, kube: Kube, make_resetter: MakeResetter,
                          managed_by: str | None, resets: bool) -> None:
    api.seed(node("n1", Verdict.EVICT, "XID_79"), appwrapper("job", managed_by=managed_by),
             pod("job-0", "job", "n1"))

    await reconcile(kube, make_resetter())

    assert stored_aw(api, "job")["status"]["phase"] == ("Resetting" if resets else "Running")


@pytest.mark.parametrize("verdict", [Verdict.PASS, Verdict.WARN, Verdict.ERR, Verdict.TESTING])
async def test_only_evict_nodes_cause_resets(api: ApiEmulator, kube: Kube,
                                             make_resetter: MakeResetter,
                                             verdict: Verdict) -> None:
    api.seed(node("n1", verdict, "REMAP_PENDING"), appwrapper("job"), pod("job-0", "job", "n1"))

    assert await reconcile(kube, make_resetter()) == {}
    assert api.writes() == []


async def test_pod_of_another_appwrapper_or_namespace_does_not_count(
        api: ApiEmulator, kube: Kube, make_resetter: MakeResetter) -> None:
    other_ns: dict[str, Any] = pod("job-0", "job", "n1")
    other_ns["metadata"]["namespace"] = "team-b"
    api.seed(node("n1", Verdict.EVICT, "XID_79"), node("n2"), appwrapper("job"),
             pod("job-1", "job", "n2"), pod("other-0", "other", "n1"), other_ns)

    assert await reconcile(kube, make_resetter()) == {}
    assert api.writes() == []
