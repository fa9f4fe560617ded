"""The command table: every command a user can name answers `--help` with its own
usage, and `healthd --help` lists them all with their help lines."""

from __future__ import annotations

import pytest

from healthd.cli import COMMANDS, main


@pytest.mark.parametrize("name", [command.name for command in COMMANDS])
def test_every_command_has_its_own_help(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([name, "--help"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: healthd {name}")


def test_top_level_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for command in COMMANDS:
        assert f"{command.name} {' '.join(command.help.split())}" in out


def test_sim_control_without_sim_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["agent", "--sim-control", "faults.jsonl"])
    assert exit_info.value.code == 64
    assert "--sim-control needs --sim" in capsys.readouterr().err
