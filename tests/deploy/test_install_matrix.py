"""The install as shipped, per stack an SRE may already run: every kustomization
renders without a deprecation warning and keeps `part-of` out of the (immutable)
selectors; the GPU runtime matrix (GPU Operator with its RuntimeClass, plain device
plugin without one and without GPU Feature Discovery labels, OpenShift); monitoring
that each Prometheus stack actually picks up (kube-prometheus-stack's `release`
selector, kube-prometheus' Role for prometheus-k8s, plain prometheus.io annotations);
diagnostic Jobs in a priority class that never preempts."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from healthd.config import load_config
from healthd.sim.rbac import RbacAuthorizer
from tests.deploy.manifests import (
    COMPONENTS,
    DEPLOY,
    NAMESPACE,
    OVERLAYS,
    STACKS,
    Obj,
    find,
    one,
    render,
    render_text,
)

PART_OF = "app.kubernetes.io/part-of"
SELECTED_KINDS = ("DaemonSet", "Deployment", "Service", "PodDisruptionBudget")
MONITOR_KINDS = ("ServiceMonitor", "PrometheusRule")
PROMETHEUS_K8S = "system:serviceaccount:monitoring:prometheus-k8s"


def every_kustomization() -> list[Path]:
    """Every directory under deploy/ with a kustomization (new ones are covered too)."""
    return sorted(p.parent for p in DEPLOY.rglob("kustomization.yaml"))


def kind_of(directory: Path) -> str:
    return str(yaml.safe_load((directory / "kustomization.yaml").read_text())["kind"])


@pytest.fixture(scope="module")
def overlay() -> dict[str, list[Obj]]:
    return {name: render(path) for name, path in OVERLAYS.items()}


def agent_pod(objects: list[Obj]) -> Obj:
    return one(objects, "DaemonSet", "healthd-agent")["spec"]["template"]


# -- kustomize -----------------------------------------------------------------------


@pytest.mark.parametrize("directory", every_kustomization(),
                         ids=lambda p: str(p.relative_to(DEPLOY)) or ".")
def test_every_kustomization_renders_without_a_warning(directory: Path, tmp_path: Path) -> None:
    """render() fails on anything kustomize prints on stderr (its deprecation warnings:
    bases, patchesStrategicMerge, patchesJson6902, commonLabels, ...)."""
    if kind_of(directory) == "Component":  # rendered inside a user's kustomization
        render_text(tmp_path, "resources: [{overlay}]\ncomponents: [{component}]\n",
                    overlay=OVERLAYS["gpu-operator"], component=directory)
    else:
        assert render(directory)
    text = (directory / "kustomization.yaml").read_text()
    for old in ("bases:", "patchesStrategicMerge:", "patchesJson6902:", "commonLabels:",
                "vars:", "images:\n  - name: *"):
        assert f"\n{old}" not in text, f"{directory}: deprecated `{old}`"


def test_part_of_labels_objects_but_no_selector(overlay: dict[str, list[Obj]]) -> None:
    """Selectors are immutable: a label in them blocks any later change of it."""
    for objects in overlay.values():
        for obj in objects:
            assert obj["metadata"].get("labels", {}).get(PART_OF) == "healthd", obj["kind"]
        for obj in [o for o in objects if o["kind"] in SELECTED_KINDS]:
            spec = obj["spec"]
            selector = spec["selector"] if obj["kind"] == "Service" else \
                spec["selector"]["matchLabels"]
            assert PART_OF not in selector, f"{obj['kind']} {obj['metadata']['name']}"
        for kind in ("DaemonSet", "Deployment"):
            (workload,) = find(objects, kind)
            assert workload["spec"]["template"]["metadata"]["labels"][PART_OF] == "healthd"


# -- the GPU runtime matrix ----------------------------------------------------------


def test_gpu_operator_runs_the_agent_under_its_runtime_class_on_gfd_nodes(
        overlay: dict[str, list[Obj]]) -> None:
    spec = agent_pod(overlay["gpu-operator"])["spec"]
    assert spec["runtimeClassName"] == "nvidia"
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}


def test_device_plugin_needs_no_runtime_class_and_no_gfd_label(
        overlay: dict[str, list[Obj]]) -> None:
    spec = agent_pod(overlay["device-plugin"])["spec"]
    assert "runtimeClassName" not in spec  # the toolkit is the nodes' default runtime
    assert spec["nodeSelector"] == {"healthd.io/gpu-node": "true"}
    assert not any(k.startswith(("nvidia.com/", "feature.node.kubernetes.io/"))
                   for k in spec["nodeSelector"])
    env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"  # the default runtime shows the GPUs


def test_the_node_selection_is_the_users_to_choose(tmp_path: Path) -> None:
    """An overlay of the user's own over ours picks the label their GPU nodes carry."""
    objects = render_text(tmp_path, """\
resources: [{overlay}]
patches:
  - target: {{kind: DaemonSet, name: healthd-agent}}
    patch: |
      - op: replace
        path: /spec/template/spec/nodeSelector
        value: {{cloud.example.com/accelerator: h100}}
""", overlay=OVERLAYS["device-plugin"])
    assert agent_pod(objects)["spec"]["nodeSelector"] == {"cloud.example.com/accelerator": "h100"}


def test_openshift_uses_no_runtime_class(overlay: dict[str, list[Obj]]) -> None:
    assert "runtimeClassName" not in agent_pod(overlay["openshift"])["spec"]


@pytest.mark.parametrize(("flavour", "host_engine"), [
    ("gpu-operator", "nvidia-dcgm.gpu-operator.svc:5555"),
    ("openshift", "nvidia-dcgm.nvidia-gpu-operator.svc:5555"),
    ("device-plugin", "$(HOST_IP):5555"),  # a host engine on the node, on its IP
])
def test_every_flavour_points_dcgmi_at_its_nodes_host_engine(
        overlay: dict[str, list[Obj]], flavour: str, host_engine: str) -> None:
    env = {e["name"]: e for e in agent_pod(overlay[flavour])["spec"]["containers"][0]["env"]}
    assert env["DCGM_HOST_ENGINE"]["value"] == host_engine
    assert env["HOST_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"
    names = list(env)
    if "$(HOST_IP)" in host_engine:  # the kubelet expands only variables defined before
        assert names.index("HOST_IP") < names.index("DCGM_HOST_ENGINE")


def test_diagnostic_jobs_run_under_the_agents_runtime_class(
        overlay: dict[str, list[Obj]], tmp_path: Path) -> None:
    """Where the agent needs RuntimeClass nvidia to see the GPUs, its diagnostic Jobs
    get it too (through the agent's environment); where it needs none, neither do they."""
    seen = set()
    for objects in overlay.values():
        (cm,) = find(objects, "ConfigMap")
        path = tmp_path / "config.yaml"
        path.write_text(cm["data"]["config.yaml"])
        pod = agent_pod(objects)["spec"]
        env = {e["name"]: e["value"] for e in pod["containers"][0]["env"]
               if e["name"] == "DIAGNOSTIC_RUNTIME_CLASS"}
        config = load_config(path, env=env)
        assert config.agent.deep_diagnostics.runtime_class == pod.get("runtimeClassName")
        seen.add(pod.get("runtimeClassName"))
    assert seen == {"nvidia", None}  # both kinds of overlay were rendered


# -- monitoring on each stack --------------------------------------------------------


def test_kube_prometheus_stack_selects_every_monitoring_object() -> None:
    """The chart's default serviceMonitorSelector and ruleSelector: release=<release>."""
    objects = render(STACKS["kube-prometheus-stack"])
    monitors = [o for o in objects if o["kind"] in MONITOR_KINDS]
    assert {o["kind"] for o in monitors} == set(MONITOR_KINDS)
    for obj in monitors:
        assert obj["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_the_release_label_is_configurable(tmp_path: Path) -> None:
    objects = render_text(tmp_path, """\
resources: [{operator}]
labels:
  - pairs: {{release: prom}}
""", operator=DEPLOY / "monitoring" / "operator")
    monitors = [o for o in objects if o["kind"] in MONITOR_KINDS]
    assert len(monitors) == 3
    assert {o["metadata"]["labels"]["release"] for o in monitors} == {"prom"}
    for monitor in find(objects, "ServiceMonitor"):  # selectors untouched by the label
        assert "release" not in monitor["spec"]["selector"]["matchLabels"]


def test_kube_prometheus_may_discover_the_targets() -> None:
    objects = render(STACKS["kube-prometheus"])
    authz = RbacAuthorizer.from_manifests(objects)
    for group, resource in (("", "pods"), ("", "services"), ("", "endpoints"),
                            ("discovery.k8s.io", "endpointslices")):
        for verb in ("list", "watch"):
            assert authz.allows(PROMETHEUS_K8S, verb, group, resource, namespace=NAMESPACE)
            assert not authz.allows(PROMETHEUS_K8S, verb, group, resource, namespace="default")
    assert not authz.allows(PROMETHEUS_K8S, "list", "", "secrets", namespace=NAMESPACE)
    assert {o["kind"] for o in objects} >= set(MONITOR_KINDS)


def test_plain_prometheus_finds_annotated_pods(tmp_path: Path) -> None:
    objects = render_text(tmp_path, "resources: [{overlay}]\ncomponents: [{component}]\n",
                          overlay=OVERLAYS["gpu-operator"],
                          component=COMPONENTS / "prometheus-annotations")
    for kind, name in (("DaemonSet", "healthd-agent"), ("Deployment", "healthd-controller")):
        template = one(objects, kind, name)["spec"]["template"]
        annotations = template["metadata"]["annotations"]
        (port,) = template["spec"]["containers"][0]["ports"]
        assert annotations["prometheus.io/scrape"] == "true"
        assert annotations["prometheus.io/port"] == str(port["containerPort"])
        assert annotations["prometheus.io/path"] == "/metrics"
    assert not find(objects, "ServiceMonitor")  # one scrape per target, not two


# -- priority ------------------------------------------------------------------------


def test_diagnostic_jobs_never_preempt(overlay: dict[str, list[Obj]], tmp_path: Path) -> None:
    for objects in overlay.values():
        (cm,) = find(objects, "ConfigMap")
        path = tmp_path / "config.yaml"
        path.write_text(cm["data"]["config.yaml"])
        named = load_config(path, env={}).agent.deep_diagnostics.priority_class
        diagnostic = one(objects, "PriorityClass", str(named))
        assert diagnostic["preemptionPolicy"] == "Never"
        agent_class = agent_pod(objects)["spec"]["priorityClassName"]
        assert agent_class != named  # the agent's own class may preempt; the Jobs' not
        assert one(objects, "PriorityClass", agent_class)["preemptionPolicy"] == \
            "PreemptLowerPriority"
