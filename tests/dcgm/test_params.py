"""The dcgm check's parameters and properties: the command line it builds, which
levels need the GPUs to themselves, per-level deadlines, and the simulated dcgmi."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from checks.base import Check
from checks.dcgm import DcgmCheck
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
    [{"level": 0}, {"level": 5}, {"level": "deep"}, {"command": []}, {"timeout_s": 0}, {"lvl": 1}],
)
def test_bad_params_are_rejected(params: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        DcgmCheck(params)


def test_sim_command_replays_a_recording() -> None:
    argv = fake_dcgmi_command(DcgmSim(output="v4-fail-r3", exit=1, sleep_s=0.5))
    assert argv[1:] == [str(FAKE_DCGMI), "--output", "v4-fail-r3", "--exit", "1", "--sleep", "0.5",
                         "--dcgm-version", "4.2.3"]


def test_sim_rejects_an_unknown_recording() -> None:
    with pytest.raises(ValidationError, match="v4-pass-r1"):
        DcgmSim(output="no-such-recording")
