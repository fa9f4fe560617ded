"""Long-running programs of the test control plane: started with their output in a log
file, waited for by a readiness probe, stopped with SIGTERM then SIGKILL.

Each program runs in a session of its own (a terminal's Ctrl-C or hang-up goes to the
test run, not to it), so nothing ends it but this module. Unless it is started to
`outlive` this process (a by-hand `python -m tests.realcluster up`), a program ends
with the process that started it, whatever ends that:

- SIGTERM, SIGINT and SIGHUP: the first program started from the main thread puts in
  handlers that end every program still running (SIGTERM to each group, SIGKILL to
  what is left after a grace), then hand the signal on as before (the default death,
  or pytest's KeyboardInterrupt with its fixture teardown); a normal exit ends them
  through `atexit`;
- a death no handler sees (SIGKILL, a crash): the kernel sends each program started
  from the main thread SIGTERM when that thread dies (PR_SET_PDEATHSIG; the kernel
  ties the signal to the thread that forked, so a program started from another
  thread, a kubelet's, has only the handlers).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import socket
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

GRACE_S = 10.0  # a program's time to stop after SIGTERM, before SIGKILL
ENDING_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


class StartError(RuntimeError):
    """A program did not come up: the message names it and ends with its log."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def log_tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no log)"


@dataclass
class Program:
    """One program; `outlive`: it keeps running after this process ends (see the module
    docstring), for a by-hand `up` that `down` stops."""

    name: str
    argv: list[str]
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    outlive: bool = False

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        in_main = threading.current_thread() is threading.main_thread()
        if not self.outlive and in_main:
            end_with_this_process()
        dies_with_us = None if self.outlive or not in_main else _parent_death_signal()
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env={**os.environ, **self.env},
                                         start_new_session=True, preexec_fn=dies_with_us)
        if not self.outlive:
            _RUNNING[self.proc.pid] = self

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace_s: float = GRACE_S) -> None:
        proc = self._detach()
        if proc is None:
            return
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait(5)

    def kill(self) -> None:
        """SIGKILL: a crash, not a shutdown."""
        proc = self._detach()
        if proc is not None:
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait(5)

    def _detach(self) -> subprocess.Popen[bytes] | None:
        """The process, if it still runs, now no longer this program's to track."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        _RUNNING.pop(proc.pid, None)
        return proc if proc.poll() is None else None

    def wait_until(self, ready: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.running():
                raise StartError(f"{self.name} exited while waiting for {what}:\n"
                                 f"{log_tail(self.log)}")
            with contextlib.suppress(Exception):
                if ready():
                    return
            time.sleep(0.25)
        raise StartError(f"{self.name}: no {what} within {timeout_s:.0f} s:\n{log_tail(self.log)}")


# -- ending with this process (see the module docstring) ------------------------------

_RUNNING: dict[int, Program] = {}  # started, not outliving us, not yet stopped: by pid
_tied = False  # whether the handlers are in (once per process)


def end_with_this_process() -> None:
    """Put in the handlers that end every running program with this process (once;
    from the main thread, where Python runs signal handlers)."""
    global _tied
    if _tied:
        return
    for signum in ENDING_SIGNALS:
        signal.signal(signum, _ending(signal.getsignal(signum)))
    atexit.register(end_all)
    _tied = True


def _ending(before: Callable[[int, FrameType | None], object] | int | None
            ) -> Callable[[int, FrameType | None], None]:
    """A handler that ends every program, then does what `before` did."""
    def handle(signum: int, frame: FrameType | None) -> None:
        end_all()
        if callable(before):
            before(signum, frame)
        elif before != signal.SIG_IGN:  # the default: die of this signal, as before
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
    return handle


def end_all(grace_s: float = GRACE_S) -> None:
    """End every running program and whatever it started (its process group): SIGTERM
    to all at once, SIGKILL to what is left after `grace_s`. Safe inside a signal
    handler: it neither reaps nor takes the locks a Popen.wait may hold."""
    groups = list(_RUNNING)
    _RUNNING.clear()
    for group in groups:
        _signal_group(group, signal.SIGTERM)
    _wait_gone(groups, grace_s)
    for group in groups:
        _signal_group(group, signal.SIGKILL)
    _wait_gone(groups, 5.0)


def group_members(groups: set[int]) -> dict[int, str]:
    """The live processes (not zombies) in any of `groups`: pid -> command name."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            text = stat.read_text()
            comm, rest = text[text.index("(") + 1:text.rindex(")")], text[text.rindex(")") + 2:]
            state, _parent, group = rest.split()[:3]
            if int(group) in groups and state not in ("Z", "X"):
                found[int(stat.parent.name)] = comm
    return found


def _wait_gone(groups: list[int], within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while group_members(set(groups)) and time.monotonic() < deadline:
        time.sleep(0.1)


def _signal_group(group: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signum)


def _parent_death_signal() -> Callable[[], None] | None:
    """What a child runs before it execs: SIGTERM when the thread that started it dies
    (None where prctl is not there: not Linux). Resolved here, in the parent: the
    child between fork and exec calls it and nothing else."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def die_with_parent() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # it died before the line above: end now
            os.kill(os.getpid(), signal.SIGTERM)
    return die_with_parent


def http_ok(url: str, *, ca: Path | None = None, cert: tuple[Path, Path] | None = None) -> bool:
    """Whether GET `url` answers 200 (TLS verified against `ca` when given)."""
    context = None
    if url.startswith("https"):
        context = (ssl.create_default_context(cafile=str(ca)) if ca
                   else ssl._create_unverified_context())
        if cert:
            context.load_cert_chain(str(cert[0]), str(cert[1]))
    try:
        with urllib.request.urlopen(url, timeout=3, context=context) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False
