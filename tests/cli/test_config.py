"""Config loading: typed, validated, errors that name the field and the fix, env
overrides, and `healthd config validate`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from checks.base import Severity
from checks.catalog import RaiseRule
from healthd.cli import main
from healthd.config import ConfigError, load_config
from healthd.util.durations import parse_duration


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "healthd.yaml"
    path.write_text(text)
    return path


def test_defaults_without_file() -> None:
    config = load_config(None, env={})
    assert config.namespace == "healthd-system"
    assert config.label_prefix == "autopilot.ibm.com/"


def test_env_overrides_node_and_namespace(tmp_path: Path) -> None:
    path = write(tmp_path, "node_name: from-file\n")
    config = load_config(path, env={"NODE_NAME": "gpu-node-7", "POD_NAMESPACE": "ops"})
    assert (config.node_name, config.namespace) == ("gpu-node-7", "ops")


@pytest.mark.parametrize(
    ("text", "seconds"), [("30s", 30), ("5m", 300), ("1h", 3600), ("250ms", 0.25), (45, 45)]
)
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


def test_code_override_reaches_the_catalog(tmp_path: Path) -> None:
    path = write(tmp_path, "codes:\n  REMAP_PENDING: {severity: EVICT, sticky: true}\n")
    spec = load_config(path, env={}).catalog().lookup("REMAP_PENDING")
    assert (spec.severity, spec.sticky) == (Severity.EVICT, True)


def test_raise_rule_override_reaches_the_catalog(tmp_path: Path) -> None:
    path = write(tmp_path, "codes:\n  HW_SLOWDOWN: {raise_seen: 3, raise_runs: 5}\n")
    catalog = load_config(path, env={}).catalog()
    rule = catalog.lookup("HW_SLOWDOWN").raise_rule
    assert (rule.seen, rule.runs) == (3, 5)
    assert catalog.lookup("PCIE_REPLAYS").raise_rule == RaiseRule(2, 3)  # the default


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("checks:\n  remaped: {}\n", "checks.remaped: unknown check; known checks:"),
        ("checks:\n  remapped: {interval: soon}\n", "checks.remapped.interval"),
        ("checks:\n  dcgm: {params: {level: 9}}\n", "checks.dcgm.params: level"),
        ("checks:\n  power: {params: {bogus: 1}}\n", "checks.power.params: bogus"),
        ("codes:\n  NOPE: {severity: ERR}\n", "unknown finding code(s) NOPE"),
        (
            "codes:\n  XID_79: {severity: UNKNOWN}\n",
            "severity must be one of PASS, WARN, ERR, EVICT",
        ),
        ("codes:\n  HW_SLOWDOWN: {raise_seen: 4, raise_runs: 3}\n",
         "raise_seen (4) cannot exceed raise_runs (3)"),
        ("codes:\n  HW_SLOWDOWN: {raise_seen: 2}\n", "give both raise_seen and raise_runs"),
        ("expected_gpus: -1\n", "expected_gpus"),
        ("label_prefix: Not A Prefix\n", "label_prefix: Value error"),
        ("- a\n- list\n", "expected a mapping at the top level"),
        ("key: [unclosed\n", "is not valid YAML"),
    ],
)
def test_bad_config_names_the_field(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_config(path, env={})
    assert expected.replace("label_prefix: Value error", "label_prefix: must be") in str(err.value)


def test_validate_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = write(tmp_path, "checks:\n  pciebw: {interval: 2h, params: {min_fraction: 0.6}}\n")
    assert main(["config", "validate", str(good)]) == 0
    out = capsys.readouterr().out
    assert "valid" in out and '"min_fraction": 0.6' in out and '"interval": 7200.0' in out


def test_validate_command_rejects_bad_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = write(tmp_path, "checks:\n  remapped: {timeout: -1}\n")
    assert main(["config", "validate", str(bad)]) == 78
    assert "checks.remapped.timeout" in capsys.readouterr().err


@pytest.mark.parametrize(("entry", "expected"), [
    ('{check: "dcgm:9", cron: "0 3 * * 0"}',
     "agent.diagnostics.0.check: dcgm:9: check dcgm: level: Input should be less than or "
     "equal to 4"),
    ('{check: "dcgm:0", interval: 1h}', "agent.diagnostics.0.check: dcgm:0"),
])
def test_a_scheduled_diagnostic_is_checked_like_the_command_line(
        tmp_path: Path, entry: str, expected: str) -> None:
    path = write(tmp_path, f"agent: {{diagnostics: [{entry}]}}\n")
    proc = subprocess.run([sys.executable, "-m", "healthd.cli", "config", "validate", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 78
    assert expected in proc.stderr
    assert proc.stdout == ""  # nothing printed as "valid"
    check = subprocess.run([sys.executable, "-m", "healthd.cli", "check", "--checks",
                            entry.split('"')[1]], capture_output=True, text=True, timeout=60)
    assert check.returncode == 64  # the same argument, refused the same way


def test_a_good_scheduled_diagnostic_validates(tmp_path: Path) -> None:
    path = write(tmp_path, 'agent: {diagnostics: [{check: "dcgm:3", cron: "0 3 * * 0"}]}\n'
                           "checks: {dcgm: {params: {timeout_s: 600}}}\n")
    assert load_config(path, env={}).agent.diagnostics[0].check == "dcgm:3"


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "absent.yaml", env={})
