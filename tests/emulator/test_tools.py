"""The reusable pytest fixtures, the threaded runner with a kubeconfig, and
`python -m healthd.sim.apiserver` printing a URL a client can use."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import kubernetes.client as sync_client
import kubernetes.config as sync_config
import pytest

from healthd.sim.apiserver import ApiEmulator, ThreadedEmulator
from healthd.sim.apiserver.testing import api, sync_api  # noqa: F401 - fixtures


@pytest.mark.anyio
async def test_async_fixture_serves_the_async_client(api: ApiEmulator) -> None:  # noqa: F811
    api.seed({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}})
    from kubernetes.aio.client import CoreV1Api

    async with api.async_client() as client:
        names = [n.metadata.name for n in (await CoreV1Api(client).list_namespace()).items]
    assert names == ["x"]


def test_threaded_emulator_through_a_kubeconfig(sync_api: ThreadedEmulator,  # noqa: F811
                                                tmp_path: Path) -> None:
    path = sync_api.write_kubeconfig(tmp_path / "kubeconfig")
    with sync_config.new_client_from_config(config_file=str(path)) as client:
        sync_client.CoreV1Api(client).create_node({"metadata": {"name": "n1"}})
    assert sync_api.get("Node", "n1") is not None
    assert sync_api.writes("POST", "/api/v1/nodes")[0].user == "admin"
    sync_api.go_away()
    sync_api.come_back()
    with sync_api.sync_client() as client:
        assert sync_client.CoreV1Api(client).read_node("n1").metadata.name == "n1"


def test_module_prints_url_and_writes_kubeconfig(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kc"
    proc = subprocess.Popen(
        [sys.executable, "-m", "healthd.sim.apiserver", "--port", "0",
         "--kubeconfig", str(kubeconfig)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        with sync_config.new_client_from_config(config_file=str(kubeconfig)) as client:
            assert sync_client.CoreV1Api(client).list_node().items == []
    finally:
        proc.terminate()
        proc.wait(timeout=10)
