"""A kubeconfig that cannot be used, as every API-facing command meets it: `agent`,
`controller`, `status` and `trigger` each exit 78 with one line naming the file and
what is wrong with it, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

HEALTHD = [sys.executable, "-m", "healthd.cli"]
COMMANDS = {
    "agent": ["agent", "--sim", "healthy-8xh100", "--node", "gpu-1"],
    "controller": ["controller"],
    "status": ["status"],
    "trigger": ["trigger", "--nodes", "gpu-1", "--checks", "remapped"],
}
BROKEN = {
    "malformed": ("garbage: [\n", "not valid YAML (line 2)"),
    "empty": ("", "the file is empty"),
    "a list": ("- a\n- b\n", "not a YAML mapping"),
}


@pytest.mark.parametrize("kind", sorted(BROKEN))
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_an_unusable_kubeconfig_is_exit_78_with_a_clear_line(
        command: str, kind: str, tmp_path: Path) -> None:
    text, said = BROKEN[kind]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(text)
    proc = subprocess.run([*HEALTHD, *COMMANDS[command], "--kubeconfig", str(kubeconfig)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 78, proc.stderr
    assert "Traceback" not in proc.stderr
    message = proc.stderr.strip().splitlines()[-1]
    assert message.startswith("healthd: ")
    assert str(kubeconfig) in message and said in message


def test_an_unknown_context_is_exit_78_naming_it(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: a\n"
        "clusters: [{name: a, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "users: [{name: a, user: {}}]\n"
        "contexts: [{name: a, context: {cluster: a, user: a}}]\n")
    proc = subprocess.run([*HEALTHD, "status", "--kubeconfig", str(kubeconfig),
                           "--context", "nowhere"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 78, proc.stderr
    assert "nowhere" in proc.stderr and "Traceback" not in proc.stderr
