"""The programs a test run starts end with it (tests.realcluster.processes), without
the control plane: a Python process starts `sleep` as a Program from its main thread
and from another thread, as the control plane and a kubelet do, and is then ended
from outside. After SIGTERM, SIGINT or SIGHUP, or an exit on an exception (a
fixture's failure), none of its programs is left; after SIGKILL, which no handler
sees, the one started from the main thread is ended by the kernel. A program started
to outlive it (a by-hand `up`) is left running."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.realcluster.processes import group_members

REPO = Path(__file__).resolve().parents[2]
# The process under test: starts its programs, says where they run, waits to be ended
# (or, given `raise`, fails as a fixture can).
STARTER = """
import json, sys, threading, time
from pathlib import Path
from tests.realcluster.processes import Program

root, how = Path(sys.argv[1]), sys.argv[2]
def sleeper(name, **kw):
    program = Program(name, ["sleep", "600"], root / f"{name}.log", **kw)
    program.start()
    return program
main = sleeper("main")
threaded = []
worker = threading.Thread(target=lambda: threaded.append(sleeper("thread")))
worker.start()
worker.join()
kept = sleeper("kept", outlive=True)
(root / "pids.json").write_text(json.dumps(
    {"main": main.pid, "thread": threaded[0].pid, "kept": kept.pid}))
if how == "raise":
    raise RuntimeError("a fixture failed")
time.sleep(600)
"""


@contextlib.contextmanager
def started(tmp_path: Path, how: str) -> Iterator[tuple[subprocess.Popen[bytes], dict[str, int]]]:
    """The process under test, once its programs run (program -> process group); every
    group is ended afterwards, whatever the test found."""
    run = subprocess.Popen([sys.executable, "-c", STARTER, str(tmp_path), how], cwd=REPO,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    report = tmp_path / "pids.json"
    groups: dict[str, int] = {}
    try:
        while not report.exists() and run.poll() is None:
            time.sleep(0.05)
        groups = json.loads(report.read_text())
        yield run, groups
    finally:
        if run.poll() is None:
            run.kill()
        run.wait()
        for group in groups.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)


def left(groups: dict[str, int]) -> set[str]:
    """The programs still running."""
    return {name for name, group in groups.items() if group_members({group})}


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP],
                         ids=["SIGTERM", "SIGINT", "SIGHUP"])
def test_a_signal_ends_every_program_the_process_started(
        tmp_path: Path, signum: signal.Signals) -> None:
    with started(tmp_path, "wait") as (run, groups):
        assert left(groups) == {"main", "thread", "kept"}
        run.send_signal(signum)
        assert run.wait(30) != 0  # the signal took its course: no clean exit
        assert left(groups) == {"kept"}


def test_an_exit_on_an_exception_ends_every_program(tmp_path: Path) -> None:
    with started(tmp_path, "raise") as (run, groups):
        assert run.wait(30) == 1
        assert left(groups) == {"kept"}


def test_sigkill_leaves_no_program_started_from_the_main_thread(tmp_path: Path) -> None:
    with started(tmp_path, "wait") as (run, groups):
        run.kill()
        run.wait()
        deadline = time.monotonic() + 10  # the kernel's signal, then the program's exit
        while "main" in left(groups) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "main" not in left(groups)
