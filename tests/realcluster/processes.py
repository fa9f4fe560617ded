"""Long-running programs of the test control plane: started with their output in a log
file, waited for by a readiness probe, stopped with SIGTERM then SIGKILL."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


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
    name: str
    argv: list[str]
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            # A session of its own: a by-hand `up` outlives its shell; `stop` ends it.
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env={**os.environ, **self.env},
                                         start_new_session=True)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace_s: float = 10.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self.proc = None

    def kill(self) -> None:
        """SIGKILL: a crash, not a shutdown."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)
        self.proc = None

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
