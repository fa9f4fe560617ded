"""The deploy/ manifests as a cluster would receive them: every kustomization renders
with `kubectl kustomize` and every object validates against the Kubernetes 1.30
schemas (the Prometheus Operator objects, which the validator does not know, are
checked by hand); the agent and the controller are hardened as documented; the
pieces refer to each other correctly (ConfigMap, Services, ServiceAccounts, priority
class, peers selector); the ConfigMap holds a valid config; the PrometheusRule
carries dashboards/alerts.yaml."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from healthd.agent.command import HARD_STOP_S
from healthd.cli import main
from healthd.config import Config, load_config
from tests.deploy.manifests import (
    ALERTS,
    BASE,
    KUSTOMIZATIONS,
    MONITORING,
    NAMESPACE,
    OVERLAYS,
    PROBES,
    REPAIR,
    ROOT,
    Obj,
    find,
    one,
    plain_resources,
    render,
)

K8S_VERSION = "1.30.0"
OPERATOR_GROUP = "monitoring.coreos.com/"
RBAC_KINDS = ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[Obj]]:
    return {name: render(path) for name, path in KUSTOMIZATIONS.items()}


@pytest.fixture(scope="module")
def kube(rendered: dict[str, list[Obj]]) -> list[Obj]:
    return rendered["gpu-operator"]


@pytest.fixture(scope="module")
def config(kube: list[Obj], tmp_path_factory: pytest.TempPathFactory) -> Config:
    """The ConfigMap's config, as the pods load it (no environment overrides)."""
    path = tmp_path_factory.mktemp("config") / "config.yaml"
    path.write_text(config_of(kube))
    return load_config(path, env={})


def pod_spec(objects: list[Obj], kind: str, name: str) -> Obj:
    return one(objects, kind, name)["spec"]["template"]["spec"]


def container(objects: list[Obj], kind: str, name: str) -> Obj:
    (only,) = pod_spec(objects, kind, name)["containers"]
    return only


def config_of(objects: list[Obj]) -> str:
    (cm,) = find(objects, "ConfigMap")
    return str(cm["data"]["config.yaml"])


# -- schemas -------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(KUSTOMIZATIONS))
def test_every_object_validates_against_the_kubernetes_schemas(
        rendered: dict[str, list[Obj]], name: str) -> None:
    validator = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate missing")
    objects = rendered[name]
    assert objects, f"{name} rendered nothing"
    problems = []
    for obj in objects:
        if obj["apiVersion"].startswith(OPERATOR_GROUP):
            continue  # not a Kubernetes schema: test_operator_objects_* below
        try:
            validator.validate(obj, K8S_VERSION, strict=True)
        except validator.ValidationError as exc:
            problems.append(f"{obj['kind']} {obj['metadata']['name']}: {exc.message}")
    assert problems == []


def test_operator_objects_have_their_required_fields(rendered: dict[str, list[Obj]]) -> None:
    services = find(rendered["base"], "Service")
    monitors = find(rendered["monitoring"], "ServiceMonitor")
    assert {m["metadata"]["name"] for m in monitors} == {"healthd-agent", "healthd-controller"}
    for monitor in monitors:
        selected = [s for s in services if _selects(monitor["spec"]["selector"]["matchLabels"],
                                                   s["metadata"].get("labels", {}))]
        assert len(selected) == 1, f"{monitor['metadata']['name']} selects {len(selected)}"
        ports = {p["name"] for p in selected[0]["spec"]["ports"]}
        assert monitor["spec"]["endpoints"], "a ServiceMonitor needs endpoints"
        assert all(e["port"] in ports for e in monitor["spec"]["endpoints"])
        assert monitor["spec"]["namespaceSelector"]["matchNames"] == [NAMESPACE]
    (rule,) = find(rendered["monitoring"], "PrometheusRule")
    for group in rule["spec"]["groups"]:
        assert group["name"] and group["rules"]
        for r in group["rules"]:
            assert ("alert" in r) != ("record" in r) and isinstance(r["expr"], str), r


def test_the_prometheus_rule_carries_the_alerts_file(rendered: dict[str, list[Obj]]) -> None:
    (rule,) = find(rendered["monitoring"], "PrometheusRule")
    alerts = yaml.safe_load(ALERTS.read_text())
    assert rule["spec"]["groups"] == alerts["groups"], (
        f"{ALERTS.name} changed: run python {MONITORING.relative_to(ROOT)}/sync_rules.py")


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


# -- the agent -----------------------------------------------------------------------


def test_the_agent_runs_on_gpu_nodes_without_taking_a_gpu(kube: list[Obj]) -> None:
    spec = pod_spec(kube, "DaemonSet", "healthd-agent")
    agent = container(kube, "DaemonSet", "healthd-agent")
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    for part in ("requests", "limits"):
        assert "nvidia.com/gpu" not in agent["resources"][part]
    env = {e["name"]: e for e in agent["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert spec["runtimeClassName"] == "nvidia"  # the GPU Operator's NVIDIA runtime
    downward = {name: env[name]["valueFrom"]["fieldRef"]["fieldPath"]
                for name in ("NODE_NAME", "POD_NAME", "POD_NAMESPACE")}
    assert downward == {"NODE_NAME": "spec.nodeName", "POD_NAME": "metadata.name",
                        "POD_NAMESPACE": "metadata.namespace"}


def test_the_agent_stays_on_a_node_it_marked_bad(kube: list[Obj]) -> None:
    tolerations = pod_spec(kube, "DaemonSet", "healthd-agent")["tolerations"]
    tolerated = {(t.get("key"), t.get("effect")) for t in tolerations
                 if t["operator"] == "Exists"}
    assert (None, "NoSchedule") in tolerated  # any scheduling taint, cordons included
    assert {("nvidia.com/gpu", None), ("autopilot.ibm.com/gpuhealth", None)} <= tolerated
    assert pod_spec(kube, "DaemonSet", "healthd-agent")["priorityClassName"] == \
        one(kube, "PriorityClass", "healthd-node-critical")["metadata"]["name"]


@pytest.mark.parametrize(("kind", "name"), [("DaemonSet", "healthd-agent"),
                                            ("Deployment", "healthd-controller")])
def test_pods_are_hardened(rendered: dict[str, list[Obj]], kind: str, name: str) -> None:
    for overlay in OVERLAYS:
        spec = pod_spec(rendered[overlay], kind, name)
        main_container = container(rendered[overlay], kind, name)
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        sc = main_container["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["allowPrivilegeEscalation"] is False and sc["privileged"] is False
        host_paths = [v for v in spec.get("volumes", []) if "hostPath" in v]
        if kind == "DaemonSet" and overlay != "openshift":
            # The kernel log (components/kernel-log): the one capability reading
            # /dev/kmsg needs under kernel.dmesg_restrict=1, and the device read-only.
            assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SYSLOG"]}
            assert host_paths == [{"name": "kmsg", "hostPath": {"path": "/dev/kmsg",
                                                                 "type": "CharDevice"}}]
            (mount,) = [m for m in main_container["volumeMounts"] if m["name"] == "kmsg"]
            assert mount == {"name": "kmsg", "mountPath": "/dev/kmsg", "readOnly": True}
        else:
            assert sc["capabilities"] == {"drop": ["ALL"]}
            assert host_paths == []
        assert not spec.get("hostNetwork") and not spec.get("hostPID")
        resources = main_container["resources"]
        assert {"cpu", "memory"} <= set(resources["requests"]) and "memory" in resources["limits"]


def test_ping_works_without_raw_sockets(kube: list[Obj]) -> None:
    """No capability: unprivileged ICMP sockets, allowed for every group by the pod's
    (safe, namespaced) sysctl."""
    sysctls = pod_spec(kube, "DaemonSet", "healthd-agent")["securityContext"]["sysctls"]
    assert {"name": "net.ipv4.ping_group_range", "value": "0 2147483647"} in sysctls
    ping = yaml.safe_load(config_of(kube))["checks"]["ping"]
    assert ping["params"]["privileged"] is False


def test_probes_and_grace_period_fit_the_agent(kube: list[Obj], config: Config) -> None:
    spec = pod_spec(kube, "DaemonSet", "healthd-agent")
    agent = container(kube, "DaemonSet", "healthd-agent")
    (port,) = agent["ports"]
    assert port["containerPort"] == config.agent.http_port
    assert agent["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": port["name"]}
    assert agent["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port["name"]}
    # The agent is gone HARD_STOP_S after SIGTERM at the latest; the kubelet waits longer.
    assert spec["terminationGracePeriodSeconds"] >= HARD_STOP_S + 5


# -- the controller ------------------------------------------------------------------


def test_the_controller_has_two_replicas_and_keeps_one_through_disruptions(
        kube: list[Obj]) -> None:
    deployment = one(kube, "Deployment", "healthd-controller")
    assert deployment["spec"]["replicas"] == 2
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    pdb = one(kube, "PodDisruptionBudget", "healthd-controller")
    assert pdb["spec"]["minAvailable"] == 1
    assert _selects(pdb["spec"]["selector"]["matchLabels"], labels)
    env = {e["name"] for e in container(kube, "Deployment", "healthd-controller")["env"]}
    assert "POD_NAME" in env  # the Lease holder's identity


# -- how the pieces refer to each other ----------------------------------------------


def test_the_config_map_holds_a_valid_config(kube: list[Obj], tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(config_of(kube))
    assert main(["config", "validate", str(path)]) == 0, capsys.readouterr().err
    (cm,) = find(kube, "ConfigMap")
    for kind, name in (("DaemonSet", "healthd-agent"), ("Deployment", "healthd-controller")):
        volumes = {v["name"]: v for v in pod_spec(kube, kind, name)["volumes"]}
        assert volumes["config"]["configMap"]["name"] == cm["metadata"]["name"]


def test_the_config_names_what_the_manifests_create(kube: list[Obj], config: Config) -> None:
    deep = config.agent.deep_diagnostics
    account = one(kube, "ServiceAccount", str(deep.service_account))
    assert account["metadata"]["namespace"] == deep.namespace == PROBES
    assert account["automountServiceAccountToken"] is False
    one(kube, "PriorityClass", str(deep.priority_class))
    assert config.agent.peers.namespace == NAMESPACE
    assert config.probe_namespace == PROBES
    probes = one(kube, "Namespace", PROBES)["metadata"]["labels"]
    assert probes["pod-security.kubernetes.io/enforce"] == "restricted"
    key, _, value = config.agent.peers.label_selector.partition("=")
    ds = one(kube, "DaemonSet", "healthd-agent")
    assert ds["spec"]["template"]["metadata"]["labels"][key] == value
    assert ds["metadata"]["namespace"] == config.agent.peers.namespace


def test_services_reach_the_pods(kube: list[Obj]) -> None:
    workloads = find(kube, "DaemonSet") + find(kube, "Deployment")
    for service in find(kube, "Service"):
        targets = [w for w in workloads if _selects(service["spec"]["selector"],
                                                    w["spec"]["template"]["metadata"]["labels"])]
        assert len(targets) == 1, service["metadata"]["name"]
        (served,) = targets[0]["spec"]["template"]["spec"]["containers"]
        names = {p["name"] for p in served["ports"]}
        assert all(p["targetPort"] in names for p in service["spec"]["ports"])


def test_everything_lives_in_healthd_system_but_node_events_and_what_healthd_creates(
        kube: list[Obj]) -> None:
    elsewhere = {(o["kind"], o["metadata"]["name"], o["metadata"].get("namespace"))
                 for o in kube if o["metadata"].get("namespace") not in (None, NAMESPACE)}
    assert elsewhere == {("Role", "healthd-agent-events", "default"),
                         ("RoleBinding", "healthd-agent-events", "default"),
                         ("ServiceAccount", "healthd-diagnostic", PROBES),
                         *((kind, name, PROBES) for kind in ("Role", "RoleBinding")
                           for name in ("healthd-agent-diagnostics", "healthd-agent-pvc-probe")),
                         ("Role", "healthd-controller-repair", REPAIR),
                         ("RoleBinding", "healthd-controller-repair", REPAIR)}


def test_no_account_of_the_probe_namespace_has_rights(kube: list[Obj]) -> None:
    """A pod there may name any of its ServiceAccounts: none may be bound to anything."""
    bound = [(o["kind"], o["metadata"]["name"]) for o in kube if o["kind"].endswith("Binding")
             for s in o.get("subjects") or [] if s.get("namespace") == PROBES]
    assert bound == []


def test_rbac_is_what_the_rbac_tests_prove(kube: list[Obj]) -> None:
    """The RBAC tests read the plain files; the cluster gets the rendered objects."""
    def essence(objects: list[Obj]) -> list[Any]:
        return sorted(
            ((o["kind"], o["metadata"]["name"], o["metadata"].get("namespace", "")),
             yaml.safe_dump({k: o.get(k) for k in ("rules", "roleRef", "subjects")}))
            for o in objects if o["kind"] in RBAC_KINDS)
    assert essence(kube) == essence(plain_resources(BASE))


# -- overlays ------------------------------------------------------------------------


def test_openshift_lets_the_scc_pick_the_uid(rendered: dict[str, list[Obj]]) -> None:
    objects = rendered["openshift"]
    for kind, name in (("DaemonSet", "healthd-agent"), ("Deployment", "healthd-controller")):
        context = pod_spec(objects, kind, name)["securityContext"]
        assert "runAsUser" not in context and "runAsGroup" not in context
        assert context["runAsNonRoot"] is True
        assert "runtimeClassName" not in pod_spec(objects, kind, name)
    namespace = one(objects, "Namespace", NAMESPACE)
    assert namespace["metadata"]["labels"]["openshift.io/user-monitoring"] == "true"

