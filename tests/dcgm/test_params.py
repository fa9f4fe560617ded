"""The dcgm check's parameters and properties: the command line it builds, which
levels need the GPUs to themselves, per-level deadlines, and the simulated dcgmi."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from checks.base import Check
from checks.dcgm import DcgmCheck
from healthd.config import ConfigError, load_config
from healthd.sim.dcgm import FAKE_DCGMI, DcgmSim, fake_dcgmi_command


def test_command_line() -> None:
    check = DcgmCheck({"level": "2", "command": ["/opt/dcgm/dcgmi", "--host", "h"], "gpus": [0, 3]})
    assert check.argv() == ["/opt/dcgm/dcgmi", "--host", "h", "diag", "-r", "2", "-j", "-i", "0,3"]
    assert DcgmCheck().argv() == ["dcgmi", "diag", "-r", "1", "-j"]


@pytest.mark.parametrize(
    ("level", "exclusive", "timeout"),
    [(1, False, 120), (2, False, 600), (3, True, 1800), (4, True, 7200)],
)
def test_deep_levels_are_exclusive_and_slower(level: int, exclusive: bool, timeout: float) -> None:
    check = DcgmCheck({"level": level})
    assert isinstance(check, Check)
    assert (check.exclusive, check.timeout_s) == (exclusive, timeout)
    assert check.timeout_s <= DcgmCheck.DEFAULT_TIMEOUT_S


def test_timeout_param_overrides_the_level() -> None:
    assert DcgmCheck({"level": 4, "timeout_s": 30}).timeout_s == 30


@pytest.mark.parametrize(
    "params",
    [{"level": 0}, {"level": 5}, {"level": "deep"}, {"command": []}, {"timeout_s": 0}, {"lvl": 1},
     {"host_engine": "two words"}, {"host_engine": "h:99999"}, {"host_engine": "h:"},
     {"host_engine": "--rm"}],
)
def test_bad_params_are_rejected(params: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        DcgmCheck(params)


@pytest.mark.parametrize("address", ["10.0.0.5:5555", "nvidia-dcgm.gpu-operator", "[fd00::5]:5555"])
def test_host_engine_goes_to_dcgmi_as_host(address: str) -> None:
    assert DcgmCheck({"host_engine": address}).argv() == \
        ["dcgmi", "diag", "--host", address, "-r", "1", "-j"]


def test_the_pod_sets_the_host_engine_through_the_environment(tmp_path: Path) -> None:
    """Kubernetes expands $(HOST_IP):5555 in the manifest; a config file cannot."""
    path = tmp_path / "config.yaml"
    path.write_text("checks:\n  dcgm: {interval: 1h, params: {level: 1}}\n")
    config = load_config(path, env={"DCGM_HOST_ENGINE": "10.0.0.7:5555"})
    check = config.build_check("dcgm", None)
    assert isinstance(check, DcgmCheck)
    assert check.argv()[1:4] == ["diag", "--host", "10.0.0.7:5555"]
    assert load_config(path, env={}).build_check("dcgm", None).params == DcgmCheck().params
    with pytest.raises(ConfigError, match="host_engine"):
        load_config(path, env={"DCGM_HOST_ENGINE": "not an address"})


def test_sim_command_replays_a_recording() -> None:
    argv = fake_dcgmi_command(DcgmSim(output="v4-fail-r3", exit=1, sleep_s=0.5))
    assert argv[1:] == [str(FAKE_DCGMI), "--output", "v4-fail-r3", "--exit", "1", "--sleep", "0.5",
                         "--dcgm-version", "4.2.3"]


def test_sim_rejects_an_unknown_recording() -> None:
    with pytest.raises(ValidationError, match="v4-pass-r1"):
        DcgmSim(output="no-such-recording")
