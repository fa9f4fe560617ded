"""The Helm chart, deploy/helm/healthd: it lints, renders every documented values file,
refuses a misspelt value by name, and renders what kustomize renders (object by
object, for the default values and each documented variant), with a config that
`healthd config validate` accepts and that equals deploy/daemonset/base/config.yaml
for the defaults. The values an SRE sets reach the objects: the image, the checks
(Autopilot's names too), the namespace and key prefixes, the controller switches,
and MLBatch's extended Autopilot setup."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

import checks
from healthd.cli import main
from healthd.config import Config, load_config
from tests.deploy.chart import (
    CHART,
    KUBE_VERSION,
    VALUES,
    config_text,
    documented_values,
    helm,
    helm_binary,
    normalized,
    render_chart,
    template_args,
)
from tests.deploy.manifests import (
    COMPONENTS,
    DEPLOY,
    MONITORING,
    NAMESPACE,
    OVERLAYS,
    PROBES,
    REPAIR,
    ROOT,
    STACKS,
    Obj,
    documents,
    find,
    one,
    render,
    render_text,
)

# Each documented values file and the kustomize render it must equal. A variant with
# no kustomization of its own (MLBatch's setup, the migration's shadow step) is compared
# with the nearest one except for what it is meant to change (MEANT_TO_DIFFER).
KUSTOMIZE = {
    "values.yaml": [DEPLOY],
    "device-plugin.yaml": [OVERLAYS["device-plugin"]],
    "openshift.yaml": [OVERLAYS["openshift"]],
    "kube-prometheus-stack.yaml": [DEPLOY, STACKS["kube-prometheus-stack"]],
    "kube-prometheus.yaml": [DEPLOY, STACKS["kube-prometheus"]],
    "prometheus-operator.yaml": [DEPLOY, MONITORING],
    "prometheus-annotations.yaml": [COMPONENTS / "prometheus-annotations"],
    "mlbatch-autopilot.yaml": [DEPLOY, STACKS["kube-prometheus-stack"]],
    "autopilot-shadow.yaml": [DEPLOY],
}
# What a variant changes on purpose beyond the kustomize render: its config (checked
# by the tests named), and for a shadow prefix the admission policy's keys.
MEANT_TO_DIFFER: dict[str, set[object]] = {
    "mlbatch-autopilot.yaml": {"config"},  # test_mlbatch_autopilot_setup
    "autopilot-shadow.yaml": {"config", ("ValidatingAdmissionPolicy", "",
                                         "healthd-agent-node-writes")},  # test_shadow_...
}
ALIASES = {"gpupower": "power"}
# The first run on a machine builds Helm from its pinned module (minutes, once).
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def helm_path() -> Path:
    return helm_binary()


def values_path(name: str) -> Path:
    return CHART / name if name == "values.yaml" else VALUES / name


def kustomize_render(sources: list[Path], tmp_path: Path) -> list[Obj]:
    objects: list[Obj] = []
    for source in sources:
        if source.parent == COMPONENTS:  # a component renders inside a kustomization
            objects += render_text(tmp_path / "user", "resources: [{overlay}]\ncomponents: "
                                   "[{component}]\n", overlay=OVERLAYS["gpu-operator"],
                                   component=source)
        else:
            objects += render(source)
    return objects


def loaded(text: str, tmp_path: Path, name: str = "config.yaml") -> Config:
    path = tmp_path / name
    path.write_text(text)
    return load_config(path, env={})


def enabled_checks(config: Config) -> set[str]:
    return {name for name in checks.REGISTRY if config.check_section(name).enabled}


# -- lint, template, schema ------------------------------------------------------------


def test_every_values_file_is_a_documented_variant() -> None:
    """A new values file must say which kustomize render it equals (KUSTOMIZE)."""
    names = {"values.yaml"} | {p.name for p in documented_values()}
    assert names == set(KUSTOMIZE)


@pytest.mark.parametrize("name", sorted(KUSTOMIZE))
def test_helm_lint_passes(helm_path: Path, name: str) -> None:
    proc = helm(helm_path, "lint", str(CHART), "--strict", "--values", str(values_path(name)),
                "--kube-version", KUBE_VERSION)
    assert "0 chart(s) failed" in proc.stdout, proc.stdout


@pytest.mark.parametrize(("sets", "named"), [
    (["agent.nodeSelectr.gpu=true"], "nodeSelectr"),
    (["monitoring.stak=none"], "stak"),
    (["platform=gke"], "platform"),
    (["checks.enabled={pciebw,gpumem}"], "enabled"),
    (["controller.breaker.maxUnhealthy=lots"], "maxUnhealthy"),
])
def test_a_misspelt_or_unknown_value_fails_naming_it(helm_path: Path, sets: list[str],
                                                    named: str) -> None:
    proc = helm(helm_path, *template_args(sets=sets), check=False)
    assert proc.returncode != 0
    assert named in proc.stderr, proc.stderr


def test_a_misspelt_key_in_a_values_file_fails_naming_it(helm_path: Path,
                                                         tmp_path: Path) -> None:
    values = tmp_path / "mine.yaml"
    values.write_text("checks:\n  pvc:\n    storageClass: nfs\n")
    proc = helm(helm_path, *template_args([values]), check=False)
    assert proc.returncode != 0
    assert "storageClass" in proc.stderr, proc.stderr


# -- one source of truth: the chart renders what kustomize renders -----------------------


@pytest.mark.parametrize("name", sorted(KUSTOMIZE))
def test_chart_renders_what_kustomize_renders(helm_path: Path, tmp_path: Path,
                                              name: str) -> None:
    meant = MEANT_TO_DIFFER.get(name, set())
    chart = render_chart(helm_path, [values_path(name)])
    kustomize = kustomize_render(KUSTOMIZE[name], tmp_path)
    ours, theirs = normalized(chart), normalized(kustomize)
    assert sorted(ours) == sorted(theirs)
    for key in sorted(ours):
        if key not in meant:
            assert ours[key] == theirs[key], f"{name}: {key} differs from the kustomize render"
    if "config" not in meant:
        assert loaded(config_text(chart), tmp_path, "helm.yaml") == \
            loaded(config_text(kustomize), tmp_path, "kustomize.yaml")


def test_default_config_equals_the_kustomize_base_config(helm_path: Path,
                                                         tmp_path: Path) -> None:
    text = config_text(render_chart(helm_path))
    base = DEPLOY / "base" / "config.yaml"
    assert loaded(text, tmp_path) == load_config(base, env={})


@pytest.mark.parametrize("name", sorted(KUSTOMIZE))
def test_healthd_config_validate_accepts_the_rendered_config(
        helm_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(config_text(render_chart(helm_path, [values_path(name)])))
    assert main(["config", "validate", str(path)]) == 0, capsys.readouterr().err


def test_the_release_namespace_is_made_by_helm_not_the_chart(helm_path: Path) -> None:
    """`helm install --create-namespace` makes it: Helm stores the release there before
    it creates any object, so a Namespace in the chart could never be the first. The
    chart makes the ones for what the agents and the controller create."""
    for name in sorted(KUSTOMIZE):
        namespaces = find(render_chart(helm_path, [values_path(name)]), "Namespace")
        assert [n["metadata"]["name"] for n in namespaces] == [PROBES, REPAIR], name


@pytest.fixture
def edited_sources(tmp_path: Path) -> Iterator[Path]:
    """A copy of deploy/ (the chart's link to the kustomize sources kept) to edit."""
    copy = tmp_path / "deploy"
    shutil.copytree(ROOT / "deploy", copy, symlinks=True)
    yield copy


def test_a_change_to_the_kustomize_base_reaches_the_chart(helm_path: Path,
                                                          edited_sources: Path) -> None:
    """The chart reads deploy/daemonset itself: a mount added to the base DaemonSet (as a
    new check's host file would be) is in the Helm render with no edit of the chart."""
    path = edited_sources / "daemonset" / "base" / "agent-daemonset.yaml"
    text = path.read_text().replace(
        "        - name: tmp   # on disk", "        - name: added-by-test\n          hostPath:\n"
        "            path: /run/added\n        - name: tmp   # on disk")
    path.write_text(text)
    proc = helm(helm_path, "template", "healthd", str(edited_sources / "helm" / "healthd"),
                "--namespace", NAMESPACE, "--kube-version", "1.35.4")
    (agent,) = [o for o in yaml.safe_load_all(proc.stdout) if o and o["kind"] == "DaemonSet"]
    volumes = {v["name"]: v for v in agent["spec"]["template"]["spec"]["volumes"]}
    assert volumes["added-by-test"] == {"name": "added-by-test",
                                        "hostPath": {"path": "/run/added"}}


def test_a_new_overlay_patch_renders_as_kustomize_renders_it(helm_path: Path,
                                                            edited_sources: Path) -> None:
    """A strategic-merge patch with a target, added to an overlay (a host file for a new
    check): both renders still agree, object by object."""
    overlay = edited_sources / "daemonset" / "overlays" / "device-plugin"
    (overlay / "added.yaml").write_text(yaml.safe_dump({
        "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "any"},
        "spec": {"template": {"spec": {
            "containers": [{"name": "agent",
                            "volumeMounts": [{"name": "added-by-test",
                                              "mountPath": "/run/added", "readOnly": True}]}],
            "volumes": [{"name": "added-by-test", "hostPath": {"path": "/run/added"}}]}}}}))
    kustomization = overlay / "kustomization.yaml"
    edited = yaml.safe_load(kustomization.read_text())
    edited["patches"].append({"path": "added.yaml",
                              "target": {"kind": "DaemonSet", "name": "healthd-agent"}})
    kustomization.write_text(yaml.safe_dump(edited))
    chart = documents(helm(helm_path, "template", "healthd",
                           str(edited_sources / "helm" / "healthd"), "--namespace", NAMESPACE,
                           "--kube-version", KUBE_VERSION, "--set", "platform=device-plugin"
                           ).stdout)
    ours, theirs = normalized(chart), normalized(render(overlay))
    assert ours == theirs
    agent = ours[("DaemonSet", NAMESPACE, "healthd-agent")]["spec"]["template"]["spec"]
    assert {"name": "added-by-test", "hostPath": {"path": "/run/added"}} in agent["volumes"]


# -- values reach the objects ---------------------------------------------------------------


def test_chart_check_names_are_healthds_plus_autopilots(helm_path: Path,
                                                        tmp_path: Path) -> None:
    """The schema's checkName is every healthd check plus Autopilot's aliases, and the
    chart turns the alias into healthd's name."""
    schema = yaml.safe_load((CHART / "values.schema.json").read_text())
    assert set(schema["definitions"]["checkName"]["enum"]) == set(checks.REGISTRY) | set(ALIASES)
    config = loaded(config_text(render_chart(helm_path, sets=["checks.enabled={gpupower}"])),
                    tmp_path)
    assert enabled_checks(config) == {"power"}


def test_mlbatch_autopilot_setup(helm_path: Path, tmp_path: Path) -> None:
    """MLBatch's PERIODIC_CHECKS (pciebw,remapped,dcgm,ping,gpupower,pvc), its PVC storage
    class and the ServiceMonitor's release label, translated."""
    objects = render_chart(helm_path, [VALUES / "mlbatch-autopilot.yaml"])
    config = loaded(config_text(objects), tmp_path)
    assert enabled_checks(config) == {"pciebw", "remapped", "dcgm", "ping", "power", "pvc"}
    assert config.check_section("pvc").params["storage_classes"] == ["nfs-client-pokprod"]
    monitors = find(objects, "ServiceMonitor") + find(objects, "PrometheusRule")
    assert {o["metadata"]["name"] for o in find(objects, "ServiceMonitor")} == \
        {"healthd-agent", "healthd-controller"}
    for obj in monitors:
        assert obj["metadata"]["labels"]["release"] == "kube-prometheus-stack", obj["kind"]


def test_checks_interval_and_autopilot_comma_string(helm_path: Path, tmp_path: Path) -> None:
    """Autopilot's PERIODIC_CHECKS string and `repeat` (one interval for all) as values."""
    objects = render_chart(helm_path, sets=["checks.enabled=remapped\\,gpupower",
                                            "checks.interval=2h", "checks.intervals.ping=10m"])
    config = loaded(config_text(objects), tmp_path)
    assert enabled_checks(config) == {"remapped", "power"}
    assert config.check_section("remapped").interval == 7200
    assert config.check_section("ping").interval == 600


def test_one_image_value_points_every_pod_and_the_diagnostic_jobs(helm_path: Path,
                                                                  tmp_path: Path) -> None:
    objects = render_chart(helm_path, sets=["image.repository=registry.example.com/healthd",
                                            "image.tag=1.2.3", "image.pullPolicy=Always"])
    image = "registry.example.com/healthd:1.2.3"
    for kind in ("DaemonSet", "Deployment"):
        for obj in find(objects, kind):
            for container in obj["spec"]["template"]["spec"]["containers"]:
                assert (container["image"], container["imagePullPolicy"]) == (image, "Always")
    assert loaded(config_text(objects), tmp_path).agent.deep_diagnostics.image == image
    creates = yaml.safe_dump(one(objects, "ValidatingAdmissionPolicy", "healthd-agent-creates"))
    assert f"c.image == '{image}'" in creates and "ghcr.io/healthd/healthd" not in creates


def test_the_configured_probe_image_reaches_the_policy(helm_path: Path) -> None:
    objects = render_chart(helm_path, sets=[
        "config.checks.pvc.params.pod_image=mirror.example.com/pause:3.10"])
    creates = yaml.safe_dump(one(objects, "ValidatingAdmissionPolicy", "healthd-agent-creates"))
    assert "c.image == 'mirror.example.com/pause:3.10'" in creates
    assert "registry.k8s.io" not in creates


def test_another_namespace_reaches_rbac_policy_and_config(helm_path: Path,
                                                          tmp_path: Path) -> None:
    objects = render_chart(helm_path, namespace="autopilot")
    for obj in objects:
        assert obj["metadata"].get("namespace") in (None, "autopilot", "autopilot-probes",
                                                    "autopilot-repair", "default"), obj["kind"]
    for binding in find(objects, "RoleBinding") + find(objects, "ClusterRoleBinding"):
        for subject in binding["subjects"]:
            assert subject["namespace"] == "autopilot"
    policy = one(objects, "ValidatingAdmissionPolicy", "healthd-agent-node-writes")
    assert "system:serviceaccount:autopilot:healthd-agent" in \
        policy["spec"]["matchConditions"][0]["expression"]
    creates = one(objects, "ValidatingAdmissionPolicy", "healthd-agent-creates")
    assert "system:serviceaccount:autopilot:healthd-agent" in \
        creates["spec"]["matchConditions"][0]["expression"]
    assert "request.namespace == 'autopilot-probes'" in yaml.safe_dump(creates)
    assert [n["metadata"]["name"] for n in find(objects, "Namespace")] == [
        "autopilot-probes", "autopilot-repair"]
    controller = one(objects, "ValidatingAdmissionPolicy", "healthd-controller-node-writes")
    assert "system:serviceaccount:autopilot:healthd-controller" in \
        controller["spec"]["matchConditions"][0]["expression"]
    config = loaded(config_text(objects), tmp_path)
    assert (config.agent.peers.namespace, config.controller.election.namespace) == \
        ("autopilot",) * 2
    assert config.agent.deep_diagnostics.namespace == "autopilot-probes"
    assert config.controller.repair.namespace == "autopilot-repair"


def test_shadow_prefix_reaches_config_and_policy_not_the_tolerations(
        helm_path: Path, tmp_path: Path) -> None:
    """Migration step 1: the verdict under shadow.healthd.io/, allowed by the admission
    policy; the agent still tolerates a taint mirrored from Autopilot's label."""
    objects = render_chart(helm_path, [VALUES / "autopilot-shadow.yaml"])
    config = loaded(config_text(objects), tmp_path)
    assert (config.label_prefix, config.controller.dry_run) == ("shadow.healthd.io/", True)
    policy = yaml.safe_dump(one(objects, "ValidatingAdmissionPolicy",
                                "healthd-agent-node-writes")["spec"])
    assert "'shadow.healthd.io/gpuhealth'" in policy
    assert "autopilot.ibm.com/" not in policy
    tolerations = one(objects, "DaemonSet", "healthd-agent")["spec"]["template"]["spec"][
        "tolerations"]
    assert {"key": "autopilot.ibm.com/gpuhealth", "operator": "Exists"} in tolerations


def test_controller_off_leaves_no_controller_object_or_alert(helm_path: Path) -> None:
    objects = render_chart(helm_path, [VALUES / "kube-prometheus-stack.yaml"],
                           ["controller.enabled=false"])
    assert [o["kind"] for o in objects if "controller" in o["metadata"]["name"]] == []
    (rule,) = find(objects, "PrometheusRule")
    assert "healthd.controller" not in {g["name"] for g in rule["spec"]["groups"]}
    assert one(objects, "DaemonSet", "healthd-agent")


def test_controller_values_reach_config_and_deployment(helm_path: Path,
                                                       tmp_path: Path) -> None:
    objects = render_chart(helm_path, sets=[
        "controller.dryRun=true", "controller.replicas=1", "controller.slackQueues={slack-a}",
        "controller.breaker.maxUnhealthy=5", "controller.breaker.window=10m"])
    controller = loaded(config_text(objects), tmp_path).controller
    assert controller.dry_run and controller.slack_queues == ("slack-a",)
    assert (controller.breaker.max_unhealthy, controller.breaker.window) == ("5", 600)
    assert one(objects, "Deployment", "healthd-controller")["spec"]["replicas"] == 1
    assert not find(objects, "PodDisruptionBudget")  # minAvailable 1 of 1 blocks drains


def test_agent_values_reach_the_daemonset(helm_path: Path) -> None:
    objects = render_chart(helm_path, sets=[
        "agent.runtimeClassName=", "dcgm.hostEngine=10.0.0.1:5555",
        "agent.nodeSelector.gpu=yes", "agent.resources.limits.memory=2Gi",
        "agent.podAnnotations.k8s\\.v1\\.cni\\.cncf\\.io/networks=net1"])
    pod = one(objects, "DaemonSet", "healthd-agent")["spec"]["template"]
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert "runtimeClassName" not in pod["spec"] and "DIAGNOSTIC_RUNTIME_CLASS" not in env
    assert env["DCGM_HOST_ENGINE"] == "10.0.0.1:5555"
    assert pod["spec"]["nodeSelector"] == {"gpu": "yes"}
    assert pod["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"] == "net1"
    assert pod["spec"]["containers"][0]["resources"] == {"limits": {"memory": "2Gi"}}


def test_a_config_change_rolls_the_pods(helm_path: Path) -> None:
    """The config's checksum is on both pod templates: `helm upgrade` with a changed
    config replaces the agents and the controllers (kustomize: the ConfigMap's hash)."""
    def checksums(sets: list[str]) -> set[str]:
        objects = render_chart(helm_path, sets=sets)
        return {o["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
                for o in find(objects, "DaemonSet") + find(objects, "Deployment")}

    before, after = checksums([]), checksums(["checks.pvc.storageClasses={nfs}"])
    assert len(before) == len(after) == 1 and before != after


def test_the_config_value_is_merged_last(helm_path: Path, tmp_path: Path) -> None:
    """README's slim image: `config` turns the dcgm check off, and wins over a value."""
    objects = render_chart(helm_path, sets=[
        "controller.dryRun=true",
        'config.checks.dcgm.enabled=false', "config.controller.dry_run=false"])
    config = loaded(config_text(objects), tmp_path)
    assert "dcgm" not in enabled_checks(config) and "pciebw" in enabled_checks(config)
    assert config.controller.dry_run is False


def test_the_packaged_chart_carries_the_sources(helm_path: Path, tmp_path: Path) -> None:
    """`helm package` (to publish the chart) resolves the link: the archive renders the
    same objects with no deploy/daemonset beside it."""
    helm(helm_path, "package", str(CHART), "--destination", str(tmp_path))
    (archive,) = tmp_path.glob("healthd-*.tgz")
    packaged = helm(helm_path, "template", "healthd", str(archive), "--namespace", NAMESPACE,
                    "--kube-version", KUBE_VERSION).stdout
    assert packaged == helm(helm_path, *template_args()).stdout


def test_autopilots_invasive_timer_as_a_scheduled_diagnostic(helm_path: Path,
                                                             tmp_path: Path) -> None:
    """Autopilot's `invasive: 4h` is checks.diagnostics (off by default)."""
    assert loaded(config_text(render_chart(helm_path)), tmp_path).agent.diagnostics == []
    objects = render_chart(helm_path, sets=["checks.diagnostics[0].check=dcgm:3",
                                            "checks.diagnostics[0].interval=4h"])
    (entry,) = loaded(config_text(objects), tmp_path).agent.diagnostics
    assert (entry.check, entry.interval) == ("dcgm:3", 14400)
