"""Kueue and the AppWrapper operator on the test control plane, out of cluster.

Their CRDs and Kueue's webhook configurations come from the pinned module downloads.
Kueue's webhooks cannot be switched off, so they are served on 127.0.0.1 with a
certificate from the test CA, and the webhook configurations point at that URL; only
the webhooks of what this cluster runs (Kueue's own kinds, batch Jobs, AppWrappers) are
registered. The AppWrapper operator runs in its upstream dev mode (no webhooks, no
leader election), configured through its ConfigMap like in a cluster.
"""

from __future__ import annotations

import base64
import copy
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from tests.realcluster import programs
from tests.realcluster.apply import Applier, api_client, load
from tests.realcluster.processes import StartError

if TYPE_CHECKING:
    from tests.realcluster.cluster import ControlPlane

KUEUE = "sigs.k8s.io/kueue"
APPWRAPPER = "github.com/project-codeflare/appwrapper"
KUEUE_NAMESPACE = "kueue-system"
APPWRAPPER_NAMESPACE = "appwrapper-system"
APPWRAPPER_CONFIGMAP = "appwrapper-operator-config"
# Kueue reads its metrics certificate from this fixed path when it manages no
# certificates itself (cmd/kueue/main.go): only root can provide it.
KUEUE_METRICS_CERTS = Path("/etc/kueue/metrics/certs")
KUEUE_FRAMEWORKS = ["batch/job", "workload.codeflare.dev/appwrapper"]
_SERVED_RESOURCES = {"jobs", "appwrappers"}  # besides every kueue.x-k8s.io kind
Obj = dict[str, Any]


def kueue_source() -> Path:
    return programs.module_dir(KUEUE, programs.pinned_version("kueue", KUEUE))


def appwrapper_source() -> Path:
    return programs.module_dir(APPWRAPPER, programs.pinned_version("appwrapper", APPWRAPPER))


def crds() -> list[Obj]:
    """Kueue's and the AppWrapper operator's CRDs, from their module downloads."""
    folders = [kueue_source() / "config/components/crd/bases",
               appwrapper_source() / "config/crd/bases"]
    return [doc for folder in folders for path in sorted(folder.glob("*.yaml"))
            for doc in load(path) if doc.get("kind") == "CustomResourceDefinition"]


def _ns(seconds: float) -> int:
    return int(seconds * 1_000_000_000)


def appwrapper_config(**autopilot: Any) -> Obj:
    """The operator's configuration: upstream defaults, short fault-tolerance clocks so
    a reset completes in seconds, and `autopilot` overrides (e.g. monitorNodes=False)."""
    return {
        "webhooksEnabled": False,
        "controllerManager": {"health": {"bindAddress": "127.0.0.1:0"},
                              "metrics": {"bindAddress": "0"}, "leaderElection": False},
        "appwrapper": {
            "userRBACAdmissionCheck": False,
            # The operator's config decodes durations as Go's time.Duration: nanoseconds.
            "faultTolerance": {"admissionGracePeriod": _ns(10), "warmupGracePeriod": _ns(30),
                               "failureGracePeriod": _ns(10), "resetPause": _ns(5),
                               "retryLimit": 3, "deletionGracePeriod": _ns(30)},
            **({"autopilot": autopilot} if autopilot else {}),
        },
    }


# -- Kueue ----------------------------------------------------------------------------


def _webhook_certs(plane: ControlPlane) -> Path:
    folder = plane.root / "kueue-webhook-certs"
    folder.mkdir(exist_ok=True)
    shutil.copy(plane.pki / "webhook.crt", folder / "tls.crt")
    shutil.copy(plane.pki / "webhook.key", folder / "tls.key")
    return folder


def _metrics_certs(plane: ControlPlane) -> None:
    try:
        KUEUE_METRICS_CERTS.mkdir(parents=True, exist_ok=True)
        shutil.copy(plane.pki / "webhook.crt", KUEUE_METRICS_CERTS / "tls.crt")
        shutil.copy(plane.pki / "webhook.key", KUEUE_METRICS_CERTS / "tls.key")
    except OSError as exc:
        raise StartError(f"Kueue needs its metrics certificate in {KUEUE_METRICS_CERTS} "
                         f"(a path fixed in Kueue; run as root): {exc}") from exc


def _kueue_config(plane: ControlPlane) -> Path:
    config = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration",
        "namespace": KUEUE_NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{plane.ports.kueue_health}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"port": plane.ports.kueue_webhook, "host": "127.0.0.1",
                    "certDir": str(_webhook_certs(plane))},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "integrations": {"frameworks": KUEUE_FRAMEWORKS},
    }
    path = plane.root / "kueue-config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _served(webhook: Obj) -> bool:
    for rule in webhook.get("rules", []):
        if "kueue.x-k8s.io" in rule.get("apiGroups", []):
            return True
        if _SERVED_RESOURCES & set(rule.get("resources", [])):
            return True
    return False


def webhook_configurations(plane: ControlPlane) -> list[Obj]:
    """Kueue's webhook configurations, pointed at 127.0.0.1 and trimmed to the webhooks
    of what this cluster runs (others would fail every Pod or Deployment write)."""
    ca = base64.b64encode(plane.ca.read_bytes()).decode()
    out = []
    for doc in load(kueue_source() / "config/components/webhook/manifests.yaml"):
        doc = copy.deepcopy(doc)
        doc["metadata"]["name"] = f"kueue-{doc['metadata']['name']}"
        hooks = [h for h in doc.get("webhooks", []) if _served(h)]
        for hook in hooks:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{plane.ports.kueue_webhook}{path}",
                                    "caBundle": ca}
        doc["webhooks"] = hooks
        out.append(doc)
    return out


def _namespace(name: str) -> Obj:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def _configmap(config: Obj) -> Obj:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": APPWRAPPER_CONFIGMAP, "namespace": APPWRAPPER_NAMESPACE},
            "data": {"config.yaml": yaml.safe_dump(config)}}


def install(plane: ControlPlane) -> None:
    """CRDs, namespaces, Kueue with its webhooks, the AppWrapper operator."""
    applier = Applier(api_client(plane.admin_kubeconfig))
    definitions = crds()
    applier.apply(definitions)
    applier.wait_established(d["metadata"]["name"] for d in definitions)
    applier.apply([_namespace(KUEUE_NAMESPACE), _namespace(APPWRAPPER_NAMESPACE)])
    _metrics_certs(plane)
    kueue = plane._program("kueue", [
        str(programs.build("kueue")), f"--config={_kueue_config(plane)}",
        "--feature-gates=VisibilityOnDemand=false"],
        {"KUBECONFIG": str(plane.admin_kubeconfig)})
    plane._start(kueue)
    applier.apply(webhook_configurations(plane))
    start_appwrapper(plane, applier)


def start_appwrapper(plane: ControlPlane, applier: Applier | None = None) -> None:
    """(Re)start the AppWrapper operator with `plane.appwrapper_config`."""
    applier = applier or Applier(api_client(plane.admin_kubeconfig))
    config = copy.deepcopy(plane.appwrapper_config)
    config["controllerManager"]["health"]["bindAddress"] = (
        f"127.0.0.1:{plane.ports.appwrapper_health}")
    applier.apply([_configmap(config)])
    old = plane.programs.get("appwrapper")
    if old is not None:
        old.stop()
    operator = plane._program("appwrapper", [
        str(programs.build("appwrapper")), f"--config={APPWRAPPER_CONFIGMAP}",
        f"--kubeconfig={plane.admin_kubeconfig}"],
        {"NAMESPACE": APPWRAPPER_NAMESPACE, "KUBECONFIG": str(plane.admin_kubeconfig),
         "HOME": os.environ.get("HOME", "/tmp")})
    plane._start(operator)
