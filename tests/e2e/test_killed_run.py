"""A test run ended from outside takes the real control plane with it.

A pytest run (what `./quickstart test` execs) brings the control plane up through the
`realcluster` fixture, as every e2e run does (tests/e2e/held_plane.py); it is then
sent SIGTERM (CI's cancel, `kill`) or SIGINT (Ctrl-C), and once it has ended no
process is left of etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
kwok, Kueue or the AppWrapper operator, nor of anything they started (each runs in a
process group of its own: tests.realcluster.processes)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.realcluster import programs
from tests.realcluster.fixture import unavailable
from tests.realcluster.processes import group_members, log_tail

REPO = Path(__file__).resolve().parents[2]
HELD = Path(__file__).with_name("held_plane.py")
UP_WITHIN_S = 240.0  # a loaded machine starts the whole plane in one to two minutes
ENDED_WITHIN_S = 60.0  # the run's own grace for its programs is 10 s, then SIGKILL


def built() -> None:
    """The programs are built (cached), or the test is skipped (failed in CI) saying why."""
    if programs.go_binary() is None:
        unavailable("needs Go (>= 1.25) on PATH to build the real control plane")
    try:
        programs.build_all()
    except programs.BuildError as exc:
        unavailable(f"the real control plane could not be built: {exc}")


def held_plane(run: subprocess.Popen[bytes], report: Path, log: Path) -> dict[str, int]:
    """The program -> process group the run's plane reports once up; fails with the
    run's output if the run ends first or takes too long."""
    deadline = time.monotonic() + UP_WITHIN_S
    while not report.exists():
        if run.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"the held run brought no control plane up:\n{log_tail(log)}")
        time.sleep(0.5)
    return {name: int(pid) for name, pid in json.loads(report.read_text()).items()}


@pytest.mark.timeout(UP_WITHIN_S + ENDED_WITHIN_S + 60)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_run_ended_from_outside_leaves_no_program_running(
        signum: signal.Signals, tmp_path: Path) -> None:
    built()
    report, log = tmp_path / "plane.json", tmp_path / "held-run.log"
    env = {**os.environ, "HEALTHD_HELD_PLANE": str(report)}
    with log.open("wb") as out:
        run = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                f"--basetemp={tmp_path / 'run'}", str(HELD)],
                               cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    groups: set[int] = set()
    try:
        plane = held_plane(run, report, log)
        groups = set(plane.values())
        assert {"etcd", "kube-apiserver", "kwok", "kueue", "appwrapper"} <= set(plane)
        assert all(group_members({group}) for group in groups)  # all up
        run.send_signal(signum)
        run.wait(ENDED_WITHIN_S)
        left = group_members(groups)
        assert left == {}, f"left running after the run ended:\n{log_tail(log)}"
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        for group in groups:  # what a failure left: not this test's orphans
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)
