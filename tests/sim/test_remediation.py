"""The fake reboot operator plays medik8s Self Node Remediation and the kubelet
through the Kubernetes API: a request reboots its node's simulated machine once and
the Node reports a new boot id; a request for a node it has no machine of changes
nothing. Its CRDs are valid Kubernetes objects."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from healthd.kube.client import Kube
from healthd.sim.apiserver import ApiEmulator
from healthd.sim.apiserver.testing import api  # noqa: F401  (the fixture)
from healthd.sim.remediation import FakeRebootOperator, by_control_file, crds
from tests.agent.harness import eventually

pytestmark = pytest.mark.anyio
GROUP = "remediation.medik8s.io/v1alpha1"


def node(name: str) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
            "status": {"nodeInfo": {"bootID": "boot-1", "kubeletVersion": "v1.30.0"}}}


def request(name: str) -> dict[str, object]:
    return {"apiVersion": GROUP, "kind": "SelfNodeRemediation",
            "metadata": {"name": name, "namespace": "medik8s"}, "spec": {}}


def boot_id(api: ApiEmulator, name: str) -> str:  # noqa: F811
    return str(api.get("Node", name)["status"]["nodeInfo"]["bootID"])


async def test_a_request_reboots_its_nodes_machine_once_and_the_node_reports_it(
        api: ApiEmulator, tmp_path: Path) -> None:  # noqa: F811
    control = tmp_path / "n1.control"
    control.touch()
    api.seed(node("n1"), node("n2"))
    kube = Kube(api.async_client(user="operator"))
    operator = FakeRebootOperator(kube, by_control_file({"n1": control}))
    async with anyio.create_task_group() as group:
        group.start_soon(operator.run)
        api.seed(request("n1"), request("n2"))
        await eventually(lambda: boot_id(api, "n1") != "boot-1", 5, "a new boot id")
        first = boot_id(api, "n1")
        changed = request("n1") | {"status": {"phase": "Remediating"}}
        api.put(changed)  # the request changes: the node is not rebooted again
        await anyio.sleep(0.5)
        group.cancel_scope.cancel()
    await kube.close()

    assert [json.loads(line) for line in control.read_text().splitlines()] == [
        {"op": "reboot"}]
    assert operator.rebooted == ["n1"] and boot_id(api, "n1") == first
    assert api.get("Node", "n1")["status"]["nodeInfo"]["kubeletVersion"] == "v1.30.0"
    assert boot_id(api, "n2") == "boot-1"  # no machine known: left alone


def test_the_crds_are_valid_kubernetes_objects() -> None:
    validator = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate missing")
    for crd in crds():
        validator.validate(crd, "1.30.0", strict=True)
    assert {c["spec"]["names"]["kind"] for c in crds()} == {
        "SelfNodeRemediation", "SelfNodeRemediationTemplate"}
