"""`healthd demo` as a new user runs it, piped (a CI log): the line log never runs
back in time, `-o wide` shows more than the table, a scenario that opens the breaker
leaves no bare log line on stderr, and `--serve` removes its kubeconfig folder when
Ctrl-C (SIGINT) stops it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

HEALTHD = [sys.executable, "-m", "healthd.cli"]
TIME = re.compile(r"^\[\s*(-?\d+\.\d)s\] ")


def demo(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*HEALTHD, "demo", "--scenario", "mass-failure-breaker", *argv],
                          capture_output=True, text=True, timeout=180)


def test_the_log_never_runs_back_and_wide_shows_findings_and_stderr_says_who() -> None:
    table, wide = demo(), demo("-o", "wide")
    assert (table.returncode, wide.returncode) == (0, 0), table.stderr + wide.stderr
    times = [float(m.group(1)) for line in wide.stdout.splitlines()
             if (m := TIME.match(line))]
    assert times == sorted(times), times  # setup lines come first, before 0.0 s
    assert "-0.0s" not in wide.stdout
    final = lambda out: out.split("PASSED: ", 1)[1]  # noqa: E731 - the closing summary
    assert "FINDINGS" in final(wide.stdout) and "XID_79@gpu2" in final(wide.stdout)
    assert "FINDINGS" not in final(table.stdout)
    for line in wide.stderr.splitlines():  # the breaker's log line names its source
        assert line.startswith("healthd demo: healthd.controller"), line


def test_serve_removes_its_kubeconfig_folder_on_ctrl_c() -> None:
    # PYTHONFAULTHANDLER: a demo that does not stop can be made to print every
    # thread's stack (SIGABRT), so a hang says where it is.
    proc = subprocess.Popen([*HEALTHD, "demo", "--scenario", "mass-failure-breaker",
                             "--serve", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONFAULTHANDLER": "1"})
    assert proc.stdout is not None
    deadline, kubeconfig = time.monotonic() + 120, None
    try:
        while kubeconfig is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if line.strip().startswith("kubeconfig "):
                kubeconfig = Path(line.split()[1])
        assert kubeconfig is not None and kubeconfig.exists()
        proc.send_signal(signal.SIGINT)
        # Both pipes read to the end (nothing blocks on a full one); 0.7 s as a rule,
        # once over 30 s in a full run on a busy machine: a hang guard, not a goal.
        try:
            proc.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
            _, stacks = proc.communicate(timeout=30)
            raise AssertionError("still running 90 s after SIGINT; its threads:\n"
                                 + stacks[-8000:]) from None
        code = proc.returncode
    finally:
        if proc.poll() is None:
            proc.kill()
    # Ctrl-C is how --serve ends: caught by the demo's own wait even when sent the
    # moment the notice is read, so the story's result (it passed) is the exit code.
    assert code == 0
    assert not kubeconfig.parent.exists()
