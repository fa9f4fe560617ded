"""deploy/helm/remove-node-state.sh, the documented command that removes what healthd's
agents and controller left on the Nodes after an uninstall: run with the real kubectl
against the API emulator, it removes healthd's labels, annotations and condition and
nothing else."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from healthd.sim.apiserver.emulator import ApiEmulator, ThreadedEmulator
from tests.deploy.manifests import ROOT, kubectl

SCRIPT = ROOT / "deploy" / "helm" / "remove-node-state.sh"
OTHERS_LABELS = {"nvidia.com/gpu.present": "true", "autopilot.ibm.com/nodehealth": "x"}
OTHERS_ANNOTATIONS = {"node.alpha.kubernetes.io/ttl": "0", "healthd.example/keep": "1"}
READY = {"type": "Ready", "status": "True"}


@pytest.fixture
def emulator() -> Iterator[ThreadedEmulator]:
    with ApiEmulator.in_thread() as api:
        yield api


def node(name: str, labels: dict[str, str], annotations: dict[str, str],
         conditions: list[dict[str, str]]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels, "annotations": annotations},
            "status": {"conditions": conditions}}


def node_object(emulator: ThreadedEmulator, name: str) -> dict[str, Any]:
    found = emulator.get("Node", name)
    assert found is not None
    return found


def run_script(emulator: ThreadedEmulator, tmp_path: Path, **env: str) -> None:
    config = emulator.write_kubeconfig(tmp_path / "kubeconfig")
    proc = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=60,
                          check=False, env={**os.environ, "KUBECONFIG": str(config),
                                            "KUBECTL": kubectl(), **env})
    assert proc.returncode == 0, proc.stderr


def test_removes_healthds_keys_and_condition_only(emulator: ThreadedEmulator,
                                                  tmp_path: Path) -> None:
    ours = {"autopilot.ibm.com/gpuhealth": "EVICT",
            "autopilot.ibm.com/dcgm.level.3": "ERR_2026-11-24_10.00.00UTC"}
    emulator.seed(
        node("gpu-a", {**OTHERS_LABELS, **ours},
             {**OTHERS_ANNOTATIONS, "healthd.io/health": "{}", "healthd.io/last-run": "{}",
              "healthd.io/nvml-released": "healthd-system-repair/reset-1",
              "healthd.io/clearing": "{}", "healthd.io/peers": '{"epoch":1,"peers":[]}'},
             [READY, {"type": "GPUUnhealthy", "status": "True"}]),
        node("gpu-b", dict(OTHERS_LABELS), dict(OTHERS_ANNOTATIONS), [READY]),  # nothing of ours
    )
    run_script(emulator, tmp_path)
    for name in ("gpu-a", "gpu-b"):
        after = node_object(emulator, name)
        assert after["metadata"]["labels"] == OTHERS_LABELS
        assert after["metadata"]["annotations"] == OTHERS_ANNOTATIONS
        assert after["status"]["conditions"] == [READY]


def test_another_label_prefix(emulator: ThreadedEmulator, tmp_path: Path) -> None:
    """After a migration's shadow step: the shadow prefix's keys go, Autopilot's stay."""
    emulator.seed(node("gpu-a", {"shadow.healthd.io/gpuhealth": "PASS",
                                 "autopilot.ibm.com/gpuhealth": "PASS"}, {}, [READY]))
    run_script(emulator, tmp_path, LABEL_PREFIX="shadow.healthd.io/")
    assert node_object(emulator, "gpu-a")["metadata"]["labels"] == \
        {"autopilot.ibm.com/gpuhealth": "PASS"}
