"""Fixtures for the `pvc` check: an emulated API server with storage classes, the
check's door to it (healthd's `KubeProbeApi` over the real client and HTTP), and a way
to run the check the way the agent does."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from checks.base import CheckContext, CheckResult, run_check
from checks.catalog import Catalog
from checks.probes import Probes
from checks.pvc import PvcCheck
from healthd.kube.client import Kube
from healthd.kube.conventions import Keys
from healthd.kube.pvc_probe import KubeProbeApi
from healthd.sim.apiserver import ApiEmulator
from healthd.sim.apiserver.testing import api  # noqa: F401 - the emulator fixture

NODE = "gpu-node-1"
NAMESPACE = "healthd-system"


def storage_class(name: str, *, binding: str = "Immediate", reclaim: str = "Delete") -> dict:
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": name},
        "provisioner": "fake.csi.healthd.io",
        "volumeBindingMode": binding,
        "reclaimPolicy": reclaim,
    }


@pytest.fixture
async def kube(api: ApiEmulator) -> AsyncIterator[Kube]:  # noqa: F811
    """healthd's client: the real `kubernetes.aio` ApiClient over HTTP."""
    api.seed(
        storage_class("fast"),
        storage_class("slow"),
        storage_class("local", binding="WaitForFirstConsumer"),
        storage_class("archive", reclaim="Retain"),
    )
    async with Kube(api.async_client()) as client:
        yield client


@dataclass(frozen=True)
class PvcSetup:
    """What the agent gives the check: the API at construction, a round's context."""

    probes: Probes
    ctx: CheckContext


@pytest.fixture
def context(kube: Kube) -> PvcSetup:
    return PvcSetup(Probes(pvc_api=KubeProbeApi.factory(kube, Keys())),
                    CheckContext(catalog=Catalog(), node_name=NODE, namespace=NAMESPACE))


async def run_pvc(setup: PvcSetup, **params: Any) -> CheckResult:
    """One run of the check with short test timeouts, as the agent's runner runs it."""
    params.setdefault("bind_timeout_s", 0.5)
    return await run_check(PvcCheck(params, probes=setup.probes), setup.ctx, timeout_s=10)
