"""The command line behaves as a kubectl user expects: `--version`, `-o` with
table|wide|json|yaml, `--context`, `-n`, a usage error that prints the usage of
the subcommand it happened in (whoever found it: argparse or the command), and
output piped into a reader that leaves early (`| head`) ending quietly."""

from __future__ import annotations

import json
import os
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


@pytest.mark.parametrize(("argv", "usage", "message"), [
    (["trigger", "--nodes", "a", "--checks", "remaped"], "usage: healthd trigger",
     "healthd: unknown check remaped"),
    (["trigger", "--nodes", "a", "--checks", "all", "--batch", "0"], "usage: healthd trigger",
     "healthd: --batch must be at least 1"),
    (["trigger", "--nodes", "a", "--checks", "all", "--timeout", "5x"],
     "usage: healthd trigger", "healthd: --timeout: expected a duration"),
    (["status", "--verdict", "BOGUS"], "usage: healthd status", "healthd: --verdict 'BOGUS'"),
    (["check", "--checks", "dcgm:9"], "usage: healthd check", "healthd: check dcgm: level"),
    (["check", "--checks", "ping", "--peer", "n2=notanip"], "usage: healthd check",
     "healthd: bad --peer 'n2=notanip': 'notanip' is not an IPv4 or IPv6 address"),
    (["record", "--include", "bogus"], "usage: healthd record", "healthd: --include 'bogus'"),
    (["demo", "--serve", "99999"], "usage: healthd demo",
     "healthd: argument --serve: invalid port 99999: expected 0 to 65535"),
    (["agent", "--http-port", "70000"], "usage: healthd agent",
     "healthd: argument --http-port: invalid port 70000"),
])
def test_a_usage_error_found_by_the_command_prints_the_usage_too(
        argv: list[str], usage: str, message: str) -> None:
    proc = healthd(*argv)
    assert proc.returncode == 64
    assert proc.stderr.startswith(usage), proc.stderr
    assert message in proc.stderr.splitlines()[-1], proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_emulators_port_out_of_range_is_a_usage_error() -> None:
    proc = subprocess.run([sys.executable, "-m", "healthd.sim.apiserver", "--port", "99999"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 64
    assert proc.stderr.startswith("usage: python -m healthd.sim.apiserver"), proc.stderr
    assert "invalid port 99999: expected 0 to 65535" in proc.stderr


def closed_pipe_run(*argv: str) -> subprocess.CompletedProcess[str]:
    """`healthd ARGV | head -0`, without the race: the reader has left before the
    command writes a byte."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run([*HEALTHD, *argv], stdout=write_end, stderr=subprocess.PIPE,
                              text=True, timeout=90)
    finally:
        os.close(write_end)


@pytest.mark.parametrize("argv", [
    ["check", "--sim", "healthy-8xh100"],
    ["check", "--sim", "healthy-8xh100", "-o", "json"],
    ["config", "validate", "CONFIG_FILE"],
    ["version"],
])
def test_output_cut_short_by_its_reader_ends_quietly(argv: list[str], tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("expected_gpus: 8\n")
    argv = [str(config) if a == "CONFIG_FILE" else a for a in argv]
    proc = closed_pipe_run(*argv)
    assert proc.stderr == ""  # no BrokenPipeError traceback, no "Exception ignored"
    assert proc.returncode == 141  # as a shell reports a writer stopped by SIGPIPE


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
    assert elsewhere.returncode == 3  # that context's server cannot be reached
    assert "127.0.0.1:9" in elsewhere.stderr


def test_status_and_trigger_agree_on_exit_codes(cluster: tuple[ThreadedEmulator, Path]) -> None:
    _, kubeconfig = cluster
    at = ["--kubeconfig", str(kubeconfig)]
    trigger = ["trigger", "--checks", "remapped", *at]
    for argv in (["status", *at], [*trigger, "--nodes", "gpu-a"]):
        gone = healthd(*argv, "--context", "broken")
        assert gone.returncode == 3, gone.stderr  # the API server cannot be reached
        assert gone.stderr.startswith("healthd: cannot ") and "127.0.0.1:9" in gone.stderr
    for command in (["status", *at], ["status", "--watch", *at], trigger):
        bad = healthd(*command, "-l", "!!bad")  # the API server cannot parse it
        assert bad.returncode == 64, bad.stderr
        assert bad.stderr.startswith(f"usage: healthd {command[0]}"), bad.stderr
        assert "healthd: --selector '!!bad': unable to parse requirement" in bad.stderr


def test_piped_status_ends_quietly_when_its_reader_leaves(
        cluster: tuple[ThreadedEmulator, Path]) -> None:
    _, kubeconfig = cluster
    proc = closed_pipe_run("status", "--kubeconfig", str(kubeconfig))
    assert (proc.returncode, proc.stderr) == (141, "")
