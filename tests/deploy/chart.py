"""The Helm chart (deploy/helm/healthd) rendered with the pinned Helm, and what tells
its render from the kustomize render it must equal.

Helm comes from `tests.realcluster.programs` (built from its pinned Go module into a
cache outside the clone). Without Go the chart's tests skip and say why; with
CI=true a Helm that cannot be built fails them instead.
"""

from __future__ import annotations

import copy
import os
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.manifests import NAMESPACE, ROOT, Obj, documents
from tests.realcluster import programs

CHART = ROOT / "deploy" / "helm" / "healthd"
VALUES = ROOT / "deploy" / "helm" / "values"
# `helm template` has no cluster to ask; render for the Kubernetes the real control
# plane runs (the chart requires 1.30+).
KUBE_VERSION = programs.KUBERNETES_VERSION.lstrip("v")

# The differences between the two renders that are meant, and nothing else:
# - Helm's recommended labels on every object's metadata;
# - the config's checksum on the pod templates (Helm rolls the pods on a config change;
#   kustomize does it by the ConfigMap's hash-suffixed name, which is cut off here);
# - the ConfigMap's text (the chart writes the config from values: compared as the
#   loaded config instead, see test_chart.py);
# - the release's Namespace: `helm install --create-namespace` makes it (Helm stores the
#   release in it before any object of the chart exists), so the chart has only the
#   probe namespace.
HELM_LABELS = ("helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance",
               "app.kubernetes.io/version")
CONFIG_CHECKSUM = "checksum/config"
CONFIG_MAP = "healthd-config"
_HASH_SUFFIX = re.compile(rf"^{CONFIG_MAP}-[a-z0-9]{{10}}$")


def helm_binary() -> Path:
    """The pinned Helm, built on first use; a skip (or, in CI, a failure) without it."""
    try:
        return programs.build("helm")
    except programs.BuildError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"Helm could not be built: {exc}")
        pytest.skip(f"Helm could not be built: {exc}")


def helm(binary: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=120,
                          check=False)
    if check:
        assert proc.returncode == 0, f"helm {' '.join(args)} failed:\n{proc.stderr}"
    return proc


def template_args(values: Sequence[Path] = (), sets: Sequence[str] = (),
                  namespace: str = NAMESPACE) -> list[str]:
    args = ["template", "healthd", str(CHART), "--namespace", namespace,
            "--kube-version", KUBE_VERSION]
    for path in values:
        args += ["--values", str(path)]
    for item in sets:
        args += ["--set", item]
    return args


def render_chart(binary: Path, values: Sequence[Path] = (), sets: Sequence[str] = (),
                 namespace: str = NAMESPACE) -> list[Obj]:
    """`helm template` with these values files and --set items, parsed."""
    return documents(helm(binary, *template_args(values, sets, namespace)).stdout)


def documented_values() -> list[Path]:
    """Every values file the repository documents (new ones are covered too)."""
    return sorted(VALUES.glob("*.yaml"))


def config_text(objects: list[Obj]) -> str:
    """The healthd config a render mounts (the ConfigMap's only key)."""
    found = [o for o in objects if o["kind"] == "ConfigMap"
             and _config_map_name(o["metadata"]["name"]) == CONFIG_MAP]
    assert len(found) == 1, f"expected one {CONFIG_MAP} ConfigMap, found {len(found)}"
    (text,) = found[0]["data"].values()
    return str(text)


def _config_map_name(name: str) -> str:
    return CONFIG_MAP if _HASH_SUFFIX.match(name) else name


def _pod_templates(obj: Obj) -> list[dict[str, Any]]:
    template = obj.get("spec", {}).get("template") if isinstance(obj.get("spec"), dict) else None
    return [template] if isinstance(template, dict) else []


def normalized(objects: list[Obj]) -> dict[tuple[str, str, str], Obj]:
    """Objects keyed by (kind, namespace, name), with the meant differences removed."""
    out: dict[tuple[str, str, str], Obj] = {}
    for original in objects:
        if original["kind"] == "Namespace" and original["metadata"]["name"] == NAMESPACE:
            continue
        obj = copy.deepcopy(original)
        meta = obj["metadata"]
        meta["name"] = _config_map_name(meta["name"])
        for key in HELM_LABELS:
            meta.get("labels", {}).pop(key, None)
        if meta.get("labels") == {}:
            meta.pop("labels")
        if obj["kind"] == "ConfigMap" and meta["name"] == CONFIG_MAP:
            obj.pop("data")
        for template in _pod_templates(obj):
            annotations = template.get("metadata", {}).get("annotations", {})
            annotations.pop(CONFIG_CHECKSUM, None)
            if not annotations:
                template.get("metadata", {}).pop("annotations", None)
            for volume in template["spec"].get("volumes", []):
                if "configMap" in volume:
                    volume["configMap"]["name"] = _config_map_name(volume["configMap"]["name"])
        out[(obj["kind"], meta.get("namespace", ""), meta["name"])] = obj
    return out
