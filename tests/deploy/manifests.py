"""The deploy/ manifests as objects: rendered by `kubectl kustomize` when kubectl is
installed, and read straight from a kustomization's plain resource files otherwise
(enough for the RBAC tests, which need no kustomize feature)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "daemonset"
BASE = DEPLOY / "base"
OVERLAYS = {name: DEPLOY / "overlays" / name
            for name in ("gpu-operator", "device-plugin", "openshift")}
MONITORING = DEPLOY / "monitoring"
STACKS = {"kube-prometheus-stack": MONITORING / "kube-prometheus-stack",
          "kube-prometheus": MONITORING / "kube-prometheus"}
COMPONENTS = DEPLOY / "components"
KUSTOMIZATIONS = {"base": BASE, **OVERLAYS, "monitoring": MONITORING, **STACKS,
                  "default": DEPLOY}
ALERTS = ROOT / "dashboards" / "alerts.yaml"

NAMESPACE = "healthd-system"
PROBES = "healthd-system-probes"  # what the agents create: diagnostic Jobs, pvc probes
REPAIR = "healthd-system-repair"  # what the controller creates: GPU-reset Jobs
AGENT = f"system:serviceaccount:{NAMESPACE}:healthd-agent"
CONTROLLER = f"system:serviceaccount:{NAMESPACE}:healthd-controller"

Obj = dict[str, Any]


def documents(text: str) -> list[Obj]:
    """The non-empty YAML documents of `text`."""
    return [doc for doc in yaml.safe_load_all(text) if isinstance(doc, dict)]


def kubectl() -> str:
    """The kubectl binary, or a visible skip."""
    found = shutil.which("kubectl")
    if found is None:
        pytest.skip("kubectl is not installed (Debian package kubernetes-client)")
    return found


def render(directory: Path) -> list[Obj]:
    """`kubectl kustomize DIR`, parsed; a failure or any warning (kustomize warns about
    deprecated fields on stderr) fails the test with kustomize's words."""
    proc = subprocess.run([kubectl(), "kustomize", str(directory)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0, f"kubectl kustomize {directory} failed:\n{proc.stderr}"
    assert proc.stderr.strip() == "", f"kubectl kustomize {directory} warns:\n{proc.stderr}"
    return documents(proc.stdout)


def render_text(directory: Path, kustomization: str, **paths: Path) -> list[Obj]:
    """Render a kustomization written on the fly in `directory` (e.g. a user's own
    overlay over ours); `{name}` in it becomes `paths[name]` relative to `directory`
    (kustomize refuses absolute paths)."""
    directory.mkdir(parents=True, exist_ok=True)
    relative = {name: os.path.relpath(path, directory) for name, path in paths.items()}
    (directory / "kustomization.yaml").write_text(kustomization.format(**relative))
    return render(directory)


def plain_resources(directory: Path) -> list[Obj]:
    """The objects of the kustomization's `resources` files, untransformed."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    out: list[Obj] = []
    for name in kustomization.get("resources") or []:
        out += documents((directory / name).read_text())
    return out


def find(objects: list[Obj], kind: str, name: str | None = None) -> list[Obj]:
    return [o for o in objects if o.get("kind") == kind
            and (name is None or o["metadata"]["name"] == name)]


def one(objects: list[Obj], kind: str, name: str) -> Obj:
    found = find(objects, kind, name)
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]
