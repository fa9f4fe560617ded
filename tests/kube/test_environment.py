"""What the client takes from its environment, and what it does not load.

The proxy for the API server comes from the environment (HTTP_PROXY / HTTPS_PROXY,
NO_PROXY), read once when the client is built. Importing the client loads only the
few modules of the official `kubernetes` package it uses, not the generated API and
model classes, and code that wants those still gets them."""

from __future__ import annotations

import subprocess
import sys

import pytest

from healthd.kube.client import Kube
from healthd.kube.errors import Unavailable
from healthd.kube.objects import NODES
from healthd.sim.apiserver import ApiEmulator
from healthd.sim.apiserver.kubeconfig import async_api_client
from tests.kube.conftest import node

pytestmark = pytest.mark.anyio

UNRESOLVABLE = "http://api-server.invalid"  # reachable only through the proxy
PROXY_VARIABLES = ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY",
                   "all_proxy", "NO_PROXY", "no_proxy")


@pytest.fixture
def proxied_by(api: ApiEmulator, monkeypatch: pytest.MonkeyPatch) -> ApiEmulator:
    """The emulator as the HTTP proxy of the environment (it answers absolute-form
    requests like the API server behind a forwarding proxy would)."""
    for variable in PROXY_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HTTP_PROXY", api.url)
    api.seed(node("n1"))
    return api


async def test_requests_go_through_the_proxy_of_the_environment(
        proxied_by: ApiEmulator) -> None:
    async with Kube(async_api_client(UNRESOLVABLE), timeout_s=5) as kube:
        assert (await kube.get(NODES, "n1"))["metadata"]["name"] == "n1"
        assert (await kube.get(NODES, "n1"))["metadata"]["name"] == "n1"  # and again
    assert len(proxied_by.requests_to("GET", "/api/v1/nodes/n1")) == 2


async def test_no_proxy_sends_requests_straight_to_the_server(
        proxied_by: ApiEmulator, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_PROXY", "api-server.invalid")
    async with Kube(async_api_client(UNRESOLVABLE), timeout_s=5) as kube:
        with pytest.raises(Unavailable):
            await kube.get(NODES, "n1")
    assert proxied_by.requests_to("GET", "/api/v1/nodes/n1") == []


def imported_after(code: str) -> set[str]:
    """The `kubernetes` modules loaded by a fresh interpreter running `code`."""
    listing = "print('\\n'.join(m for m in sys.modules if m.startswith('kubernetes')))"
    probe = f"{code}\nimport sys\n{listing}"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, timeout=120).stdout
    return set(out.split())


def test_the_client_loads_no_generated_api_or_model_module() -> None:
    loaded = imported_after("import healthd.kube.client")
    assert "kubernetes.aio.client.api_client" in loaded
    assert not {m for m in loaded if m.startswith(("kubernetes.aio.client.api.",
                                                   "kubernetes.aio.client.models.",
                                                   "kubernetes.client"))}


def test_the_whole_official_client_is_still_there_for_code_that_asks() -> None:
    loaded = imported_after("import healthd.kube.client\n"
                            "from kubernetes.aio.client import CoreV1Api, V1Pod\n"
                            "from kubernetes import client as sync_client\n"
                            "assert CoreV1Api and V1Pod and sync_client.CoreV1Api")
    assert "kubernetes.aio.client.api.core_v1_api" in loaded
    assert "kubernetes.aio.client.models.v1_pod" in loaded
