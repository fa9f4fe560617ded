"""The command line behaves as a kubectl user expects: `--version`, `-o` with
table|wide|json|yaml, `--context`, `-n`, and a usage error that prints the usage of
the subcommand it happened in."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from healthd import __version__
from healthd.sim.apiserver import ThreadedEmulator

HEALTHD = [sys.executable, "-m", "healthd.cli"]


def healthd(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*HEALTHD, *argv], capture_output=True, text=True, timeout=90)


def test_version_flag() -> None:
    proc = healthd("--version")
    assert (proc.returncode, proc.stdout.strip()) == (0, f"healthd {__version__}")


@pytest.mark.parametrize(("argv", "usage"), [
    (["status", "--bogus"], "usage: healthd status"),
    (["trigger", "--nodes", "a", "--checks", "all", "--bogus"], "usage: healthd trigger"),
    (["check", "--output", "xml"], "usage: healthd check"),
    (["config", "validate", "x.yaml", "--bogus"], "usage: healthd config validate"),
    (["demo", "--nodes", "two"], "usage: healthd demo"),
])
def test_a_usage_error_prints_its_subcommands_usage(argv: list[str], usage: str) -> None:
    proc = healthd(*argv)
    assert proc.returncode == 64
    assert proc.stderr.startswith(usage), proc.stderr


def test_check_prints_yaml_and_a_wide_table() -> None:
    as_yaml = healthd("check", "--sim", "remap-pending", "--checks", "remapped", "-o", "yaml")
    assert as_yaml.returncode == 2
    doc = yaml.safe_load(as_yaml.stdout)
    assert doc["status"] == "ERR" and doc["checks"][0]["check"] == "remapped"

    narrow = healthd("check", "--sim", "remap-pending", "--checks", "remapped")
    wide = healthd("check", "--sim", "remap-pending", "--checks", "remapped", "-o", "wide")
    uuid = doc["checks"][0]["entities"][0]["entity"]["uuid"]
    assert uuid in wide.stdout and uuid not in narrow.stdout  # the table clips UUIDs
    assert wide.returncode == narrow.returncode == 2


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[ThreadedEmulator, Path]]:
    """An emulator and a kubeconfig with two contexts: `good` (current) and `broken`."""
    with ThreadedEmulator() as api:
        api.seed({"apiVersion": "v1", "kind": "Node",
                  "metadata": {"name": "gpu-a",
                               "labels": {"autopilot.ibm.com/gpuhealth": "PASS"}},
                  "status": {"capacity": {"nvidia.com/gpu": "8"}}},
                 {"apiVersion": "v1", "kind": "Pod",
                  "metadata": {"name": "agent-a", "namespace": "gpu-health",
                               "labels": {"app.kubernetes.io/name": "healthd-agent"}},
                  "spec": {"nodeName": "gpu-a", "containers": [{"name": "a", "image": "x"}]},
                  "status": {"phase": "Running",
                             "conditions": [{"type": "Ready", "status": "True"}]}})
        written = yaml.safe_load(api.write_kubeconfig(tmp_path / "one").read_text())
        good = written["contexts"][0]
        broken_cluster = {"name": "broken", "cluster": {"server": "http://127.0.0.1:9"}}
        written["clusters"].append(broken_cluster)
        written["contexts"].append({"name": "broken", "context": {
            **good["context"], "cluster": "broken"}})
        written["contexts"][0]["name"] = "good"
        written["current-context"] = "good"
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump(written))
        yield api, kubeconfig


def test_context_and_namespace_pick_where_status_looks(
        cluster: tuple[ThreadedEmulator, Path]) -> None:
    _, kubeconfig = cluster
    here = healthd("status", "-o", "json", "--kubeconfig", str(kubeconfig))
    assert here.returncode == 0, here.stderr
    assert json.loads(here.stdout)["nodes"][0]["agent"] is False  # not in healthd-system

    moved = healthd("status", "-o", "json", "-n", "gpu-health", "--kubeconfig", str(kubeconfig))
    assert json.loads(moved.stdout)["nodes"][0]["agent_ready"] is True

    elsewhere = healthd("status", "--context", "broken", "--kubeconfig", str(kubeconfig))
    assert elsewhere.returncode == 1  # that context's server cannot be reached
    assert "127.0.0.1:9" in elsewhere.stderr
