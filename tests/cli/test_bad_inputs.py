"""Files that are not what they should be, as an SRE's bad day brings them: configs
that parse but could not run (an infinite timeout, a 1 ms interval, a malformed cron
expression), configs and machine specs that are not UTF-8 or not YAML or nest too
deeply, a fault that ends before it starts, and NVML answering GPU_IS_LOST to the
machine-wide calls. Each is refused with the field or the file named and exit 78 (a
lost NVML: UNKNOWN, exit 3), never a traceback, by every command that reads it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from healthd.config import ConfigError, load_config
from healthd.util.exits import EX_CONFIG

EX_UNKNOWN = 3


def healthd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "healthd.cli", *args], capture_output=True,
                          text=True, timeout=60, check=False)


def refused(proc: subprocess.CompletedProcess[str], *named: str) -> None:
    assert proc.returncode == EX_CONFIG, proc.stderr
    assert "Traceback" not in proc.stderr
    for text in named:
        assert text in proc.stderr, proc.stderr


@pytest.mark.parametrize(("yaml_text", "field"), [
    ("agent: {api_timeout_s: .inf}\n", "agent.api_timeout_s"),
    ("agent: {shutdown_flush_s: .nan}\n", "agent.shutdown_flush_s"),
    ("checks: {remapped: {interval: 1ms}}\n", "checks.remapped.interval"),
    ("checks: {remapped: {timeout: 400d}}\n", "checks.remapped.timeout"),
    ("checks: {dcgm: {cron: 'not a cron'}}\n", "checks.dcgm.cron"),
    ("agent: {diagnostics: [{check: 'dcgm:3', cron: '61 * * * *'}]}\n",
     "agent.diagnostics.0.cron"),
    ("agent: {diagnostics: [{check: 'dcgm:3', interval: 1ms}]}\n",
     "agent.diagnostics.0.interval"),
    ("controller: {election: {retry_period: 1ms}}\n", "controller.election.retry_period"),
    ("controller: {resets: {rate_per_minute: .inf}}\n", "controller.resets.rate_per_minute"),
])
def test_config_validate_refuses_what_the_daemons_cannot_run(
        tmp_path: Path, yaml_text: str, field: str) -> None:
    path = tmp_path / "healthd.yaml"
    path.write_text(yaml_text)
    refused(healthd("config", "validate", str(path)), field)
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_config(path, env={})  # what the agent and the controller load, the same way


def test_config_validate_reports_every_section(tmp_path: Path) -> None:
    path = tmp_path / "healthd.yaml"
    path.write_text("agent: {http_port: -1}\ncontroller: {election: {retry_period: 1ms}}\n"
                    "checks: {foo: {}, bar: {}, remapped: {params: {bogus: 1}}}\n"
                    "codes: {NOPE: {severity: ERR}}\n")
    refused(healthd("config", "validate", str(path)), "agent.http_port", "checks.foo",
            "checks.bar", "checks.remapped.params", "codes", "controller.election.retry_period")


NOT_YAML = {
    "a stray 0xff": b"agent:\n  http_port: 9400\n\xff\n",
    "a binary file": bytes(range(256)) * 4,
    "nested too deeply": b"a: " + b"[" * 5000 + b"]" * 5000 + b"\n",
}


@pytest.mark.parametrize("what", list(NOT_YAML))
@pytest.mark.parametrize("command", [
    ["config", "validate"], ["check", "--sim", "healthy-8xh100", "--config"],
    ["agent", "--sim", "healthy-8xh100", "--config"], ["controller", "--config"],
    ["record", "--sim", "healthy-8xh100", "--config"],
])
def test_a_config_that_is_not_yaml_is_refused_by_every_command(
        tmp_path: Path, what: str, command: list[str]) -> None:
    path = tmp_path / "healthd.yaml"
    path.write_bytes(NOT_YAML[what])
    refused(healthd(*command, str(path)), str(path))


@pytest.mark.parametrize("what", list(NOT_YAML))
def test_a_machine_spec_that_is_not_yaml_is_refused(tmp_path: Path, what: str) -> None:
    path = tmp_path / "machine.yaml"
    path.write_bytes(NOT_YAML[what])
    refused(healthd("check", "--sim", str(path)), "machine spec", str(path))


def test_a_fault_that_ends_before_it_starts_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "machine.yaml"
    path.write_text("faults:\n  - {gpu: 1, at: 30, until: 10, lost: true}\n")
    refused(healthd("check", "--sim", str(path)), "faults.0", "until")


@pytest.mark.parametrize("function", ["nvmlDeviceGetCount", "nvmlSystemGetDriverVersion"])
def test_gpu_is_lost_on_a_machine_wide_call_is_no_traceback(
        tmp_path: Path, function: str) -> None:
    path = tmp_path / "machine.yaml"
    path.write_text(f"faults:\n  - gpu: 0\n    nvml_errors: [{{function: {function}, "
                    "error: GPU_IS_LOST}]\n")
    proc = healthd("check", "--sim", str(path), "--checks", "remapped,gpus")
    assert "Traceback" not in proc.stderr, proc.stderr
    if function == "nvmlDeviceGetCount":  # no GPU can be read: nothing is judged
        assert proc.returncode == EX_UNKNOWN
        assert "nvmlDeviceGetCount: GPU is lost" in proc.stdout
    else:  # the driver version is unreadable; every GPU still is
        assert proc.returncode == 0, proc.stdout
