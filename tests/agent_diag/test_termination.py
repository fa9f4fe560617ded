"""`healthd check --termination-log PATH`: the compact summary a diagnostic pod leaves
for the agent. Real CLI runs on simulated machines (pass and fail), the 4096-byte
bound with a truncation count, a path that cannot be written, and the round trip
through the agent's parser with the agent's own catalog."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from checks.base import CheckResult, Entity, Finding, Severity
from checks.catalog import Catalog, Override
from healthd.check.termination import LIMIT_BYTES, SummaryError, compact_summary, parse_summary

FAIL_SPEC = "node: sim-r3\ndcgm:\n  output: v4-fail-r3\n"


def healthd_check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "healthd.cli", "check", *args],
                          capture_output=True, text=True, timeout=60)


def test_failing_diagnostic_leaves_its_findings(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(FAIL_SPEC)
    log = tmp_path / "termination-log"
    proc = healthd_check("--sim", str(spec), "--checks", "dcgm:3", "--output", "json",
                         "--termination-log", str(log))
    assert proc.returncode == 2, proc.stderr
    summary = json.loads(log.read_text())
    assert summary["status"] == "EVICT" and summary["exit_code"] == 2
    assert [(f["code"], f["entity"], f["severity"]) for f in summary["findings"]] == [
        ("DCGM_MEMORY", "gpu/2", "EVICT"), ("DCGM_TARGETED_STRESS", "gpu/5", "ERR")]
    assert json.loads(proc.stdout)["status"] == "EVICT"  # the normal output is unchanged


def test_unwritable_path_is_a_message_not_a_crash(tmp_path: Path) -> None:
    proc = healthd_check("--sim", "healthy-8xh100", "--checks", "remapped",
                         "--termination-log", str(tmp_path / "missing" / "log"))
    assert proc.returncode == 0
    assert "cannot write the termination log" in proc.stderr


def many_findings(count: int) -> CheckResult:
    findings = tuple(
        Finding(f"XID_{n}", Severity.WARN if n % 2 else Severity.EVICT, Entity.gpu(n % 8),
                "x" * 300)
        for n in range(count))
    return CheckResult("xid", Severity.EVICT, findings)


def test_summary_fits_the_kubelet_limit_and_counts_what_it_dropped() -> None:
    text = compact_summary("n1", [many_findings(300)])
    assert len(text.encode()) <= LIMIT_BYTES
    summary = json.loads(text)
    kept = summary["findings"]
    assert summary["truncated"] == 300 - len(kept) > 0
    # The worst findings are the ones kept.
    assert {f["severity"] for f in kept} == {"EVICT"}


def test_round_trip_uses_the_readers_catalog() -> None:
    result = CheckResult("dcgm", Severity.EVICT, (
        Finding("DCGM_PCIE", Severity.EVICT, Entity.gpu(1), "pcie failed", sticky=True),))
    text = compact_summary("n1", [result])
    default = parse_summary(text, "dcgm", Catalog())
    assert default.status is Severity.EVICT and default.findings[0].sticky
    assert default.findings[0].entity == Entity.gpu(1)
    relaxed = parse_summary(text, "dcgm", Catalog({"DCGM_PCIE": Override(Severity.WARN)}))
    assert relaxed.status is Severity.WARN


@pytest.mark.parametrize("text", ["", "Error: OOMKilled", "[]", '{"checks": []}',
                                  '{"checks": [{"check": "dcgm", "status": "MAYBE"}]}',
                                  '{"checks": [{"check": "dcgm", "status": "PASS"}], '
                                  '"findings": [{"check": "dcgm", "code": "X", "entity": "?"}]}',
                                  "[" * 4096])  # a termination message's size, nested
def test_garbage_is_a_summary_error(text: str) -> None:
    with pytest.raises(SummaryError):
        parse_summary(text, "dcgm", Catalog())


@pytest.mark.parametrize(("env", "status"), [({"DCGM_HOST_ENGINE": "10.0.0.9:5555"}, "PASS"),
                                             ({}, "SKIPPED")])
def test_the_diagnostic_pod_reaches_the_host_engine_the_agent_names(
        tmp_path: Path, env: dict[str, str], status: str) -> None:
    """The agent hands its host engine to the Job as DCGM_HOST_ENGINE; without one a
    node with no local host engine comes back SKIPPED, marked for the agent to tell."""
    spec = tmp_path / "spec.yaml"
    spec.write_text("node: sim-remote\ndcgm:\n  output: v4-pass-r3\n"
                    "  host_engine: 10.0.0.9:5555\n")
    log = tmp_path / "termination-log"
    clean = {k: v for k, v in os.environ.items() if k != "DCGM_HOST_ENGINE"}
    subprocess.run([sys.executable, "-m", "healthd.cli", "check", "--sim", str(spec),
                    "--checks", "dcgm:3", "--output", "json", "--termination-log", str(log)],
                   capture_output=True, text=True, timeout=60, env={**clean, **env})
    result = parse_summary(log.read_text(), "dcgm", Catalog())
    assert result.status.value == status, result.reason
    assert result.actionable is (status == "SKIPPED")
