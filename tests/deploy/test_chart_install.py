"""The chart on the real control plane (kube-apiserver, etcd, the scheduler and
controller manager, kwok's fake nodes): every documented values file is accepted by
the API server (server-side dry run); `helm install` puts an agent on every GPU node
and on no other; `helm upgrade` with changed values rolls the agents and loses no
Node label; `helm uninstall` removes every object of the chart and leaves only the
documented state on the Nodes, which deploy/helm/remove-node-state.sh then removes.

The control plane comes from the `realcluster` fixture: without Go it is skipped with
the reason, and in CI a control plane that cannot be built or started fails the test.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.chart import CHART, KUBE_VERSION, documented_values, helm, helm_binary
from tests.deploy.manifests import NAMESPACE, ROOT, kubectl
from tests.e2e.healthd import Healthd
from tests.realcluster.cluster import ControlPlane

pytestmark = pytest.mark.timeout(900)

RELEASE = "healthd"
GPU_LABEL = "nvidia.com/gpu.present"
PREFIX = "healthd-chart-"  # this test's own fake nodes
GPU_NODES = [f"{PREFIX}gpu-0", f"{PREFIX}gpu-1"]
CPU_NODES = [f"{PREFIX}cpu-0"]
# State a node carries before healthd is installed: none of it may be lost.
KEPT_LABELS = {"team": "blue", "autopilot.ibm.com/gpuhealth": "PASS"}
# What healthd's agents would have written: the documented leftovers of an uninstall.
AGENT_LABELS = {"autopilot.ibm.com/gpuhealth": "EVICT",
                "autopilot.ibm.com/dcgm.level.3": "ERR_2026-11-24_10.00.00UTC"}
AGENT_ANNOTATIONS = {"healthd.io/health": "{}", "healthd.io/last-run": "{}",
                     "healthd.io/nvml-released": "healthd-system-repair/reset-1",
                     "healthd.io/clearing": "{}"}
MONITORING_CRD = "servicemonitors.monitoring.coreos.com"
POLL_S = 1.0


@pytest.fixture
def kubeconfig(realcluster: ControlPlane, tmp_path: Path) -> Path:
    """The admin kubeconfig of the session's real control plane, with no healthd
    installed from the kustomize sources (the e2e tests install it so): Helm takes over
    no object it did not make, so an SRE switching removes that installation first."""
    Healthd(realcluster.admin_kubeconfig, tmp_path).uninstall()
    return realcluster.admin_kubeconfig


Run = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def kube(kubeconfig: Path) -> Run:
    """kubectl against the real control plane; a failure fails the test with its words."""
    config = str(kubeconfig)

    def run(*args: str, check: bool = True, stdin: str | None = None
            ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([kubectl(), "--kubeconfig", config, *args], input=stdin,
                              capture_output=True, text=True, timeout=120, check=False)
        if check:
            assert proc.returncode == 0, f"kubectl {' '.join(args)}:\n{proc.stderr}"
        return proc
    return run


@pytest.fixture
def helm_run(kubeconfig: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    binary = helm_binary()

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return helm(binary, *args, "--kubeconfig", str(kubeconfig))
    return run


def fake_node(name: str, labels: dict[str, str]) -> dict[str, Any]:
    """A kwok node: kwok keeps it Ready and runs its pods (a fake status)."""
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {**labels, "type": "kwok"},
                         "annotations": {"kwok.x-k8s.io/node": "fake"}},
            "spec": {"taints": [{"key": "kwok.x-k8s.io/node", "value": "fake",
                                 "effect": "NoSchedule"}]},
            "status": {"capacity": {"cpu": "32", "memory": "256Gi", "pods": "110",
                                    "nvidia.com/gpu": "8"},
                       "allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110",
                                       "nvidia.com/gpu": "8"}}}


@pytest.fixture
def nodes(kube: Run) -> Iterator[None]:
    objects = [fake_node(n, {GPU_LABEL: "true", **KEPT_LABELS}) for n in GPU_NODES]
    objects += [fake_node(n, {"team": "blue"}) for n in CPU_NODES]
    # The GPU Operator's RuntimeClass, which the default platform names.
    objects.append({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
                    "metadata": {"name": "nvidia"}, "handler": "nvidia"})
    kube("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List",
                                               "items": objects}))
    yield
    kube("delete", "node", *GPU_NODES, *CPU_NODES, "--ignore-not-found")


def get_json(kube: Run, *args: str) -> Any:
    return json.loads(kube("get", *args, "-o", "json").stdout)


def wait_for(what: str, probe: Callable[[], bool], timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while not probe():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(POLL_S)


def agent_pods(kube: Run) -> dict[str, str]:
    """node name -> pod uid of the running agents on this test's nodes."""
    pods = get_json(kube, "pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/name=healthd-agent")
    return {p["spec"]["nodeName"]: p["metadata"]["uid"] for p in pods["items"]
            if p["spec"].get("nodeName", "").startswith(PREFIX)
            and p["status"].get("phase") == "Running"
            and not p["metadata"].get("deletionTimestamp")}


def node_metadata(kube: Run) -> dict[str, dict[str, Any]]:
    return {n["metadata"]["name"]: n["metadata"]
            for n in get_json(kube, "nodes")["items"] if n["metadata"]["name"].startswith(PREFIX)}


def test_every_documented_values_file_is_accepted_by_the_api_server(
        kube: Run, helm_run: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    has_monitoring = kube("get", "crd", MONITORING_CRD, check=False).returncode == 0
    # A dry run makes no namespace, so the chart's probe and repair namespaces must exist
    # already (a real install creates them first: Helm orders Namespaces before the rest).
    namespaces = (f"{NAMESPACE}-dryrun", f"{NAMESPACE}-dryrun-probes",
                  f"{NAMESPACE}-dryrun-repair")
    for namespace in namespaces:
        kube("create", "namespace", namespace)
    try:
        for values in [CHART / "values.yaml", *documented_values()]:
            text = helm_run("template", RELEASE, str(CHART), "--namespace",
                            f"{NAMESPACE}-dryrun", "--kube-version", KUBE_VERSION,
                            "-f", str(values)).stdout
            if not has_monitoring:  # the Prometheus Operator's kinds need its CRDs
                text = "\n---\n".join(doc for doc in text.split("\n---\n")
                                      if "monitoring.coreos.com/" not in doc)
            proc = kube("apply", "--dry-run=server", "--server-side", "-f", "-", stdin=text,
                        check=False)
            assert proc.returncode == 0, f"{values.name}:\n{proc.stderr}"
    finally:
        for namespace in namespaces:
            kube("delete", "namespace", namespace, "--wait=false")


def test_install_upgrade_uninstall(kube: Run, nodes: None,
                                   helm_run: Callable[..., subprocess.CompletedProcess[str]],
                                   kubeconfig: Path) -> None:
    before = node_metadata(kube)
    install = helm_run("install", RELEASE, str(CHART), "-n", NAMESPACE, "--create-namespace")
    assert "kubectl get nodes -L autopilot.ibm.com/gpuhealth" in install.stdout  # NOTES

    # Agents on the GPU nodes, none elsewhere.
    wait_for("an agent on every GPU node", lambda: set(agent_pods(kube)) == set(GPU_NODES))
    assert not set(agent_pods(kube)) & set(CPU_NODES)
    first = agent_pods(kube)

    # A changed config rolls the agents; every Node keeps every label, and Helm never
    # writes a Node.
    helm_run("upgrade", RELEASE, str(CHART), "-n", NAMESPACE, "--reuse-values",
             "--set", "checks.pvc.storageClasses={nfs-client}")
    wait_for("the agents to roll", lambda: set(agent_pods(kube)) == set(GPU_NODES) and
             not set(agent_pods(kube).values()) & set(first.values()))
    after = node_metadata(kube)
    for name, meta in before.items():
        assert after[name]["labels"] == meta["labels"], name
        managers = {f.get("manager", "") for f in after[name].get("managedFields", [])}
        assert not any("helm" in m for m in managers), managers

    # Uninstall: every chart object goes; the Nodes keep what the agents wrote (here
    # written by hand: kwok runs no agent), until the documented command removes it.
    for name in GPU_NODES:
        kube("label", "node", name, "--overwrite",
             *[f"{k}={v}" for k, v in AGENT_LABELS.items()])
        kube("annotate", "node", name, "--overwrite",
             *[f"{k}={v}" for k, v in AGENT_ANNOTATIONS.items()])
    helm_run("uninstall", RELEASE, "-n", NAMESPACE, "--wait")
    for kind, name in (("clusterrole", "healthd-agent"), ("clusterrole", "healthd-controller"),
                       ("priorityclass", "healthd-node-critical"),
                       ("validatingadmissionpolicy", "healthd-agent-node-writes"),
                       ("daemonset", "healthd-agent")):
        args = ["get", kind, name] + (["-n", NAMESPACE] if kind == "daemonset" else [])
        assert kube(*args, check=False).returncode != 0, f"{kind}/{name} left behind"
    left = node_metadata(kube)
    for name in GPU_NODES:
        assert AGENT_LABELS.items() <= left[name]["labels"].items()
        assert AGENT_ANNOTATIONS.items() <= left[name]["annotations"].items()

    proc = subprocess.run(["bash", str(ROOT / "deploy" / "helm" / "remove-node-state.sh")],
                          capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "KUBECONFIG": str(kubeconfig),
                               "KUBECTL": kubectl()})
    assert proc.returncode == 0, proc.stderr
    for name, meta in node_metadata(kube).items():
        assert not any(k.startswith("autopilot.ibm.com/") for k in meta["labels"]), name
        assert not any(k.startswith("healthd.io/") for k in meta.get("annotations", {})), name
        assert meta["labels"]["team"] == "blue"
