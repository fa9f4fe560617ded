"""Running a helper program (`dcgmi`, a bandwidth probe) under a deadline, leaving no orphans.

A diagnostic that outlives its check keeps the GPUs busy and confuses the next run, so
every program starts in its own process group (a new session) and, when the deadline
passes or the caller cancels (e.g. `checks.base.run_check`'s `move_on_after`), the
whole group is killed with SIGKILL, grandchildren included, and the program is reaped.

Errors:
- `ProgramNotFound`: the executable does not exist (not installed, not on PATH)
- `ProgramNotRunnable`: it exists but cannot be started (permissions, bad format)
- `TimeoutError`: the deadline passed; the group is already dead when it is raised
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

import anyio
from anyio.abc import ByteReceiveStream, Process

# Enough for the JSON of a level-4 run on a large node; more is dropped, not buffered.
MAX_OUTPUT_BYTES = 8 * 1024 * 1024


class ProgramNotFound(Exception):
    """The executable is not installed or not on PATH."""


class ProgramNotRunnable(Exception):
    """The executable exists but the OS refused to start it."""


@dataclass(frozen=True)
class ProcessOutput:
    """What a finished program left: its exit status (negative: killed by that
    signal) and its decoded output."""

    returncode: int
    stdout: str
    stderr: str


async def run_process(
    argv: Sequence[str], *, timeout_s: float, max_output: int = MAX_OUTPUT_BYTES
) -> ProcessOutput:
    """Run `argv` to completion within `timeout_s`, in its own process group.

    On timeout or cancellation the whole group is killed before this returns or
    re-raises, so no child survives its caller."""
    process = await _start(argv)
    finished = False
    try:
        with anyio.fail_after(timeout_s):
            stdout, stderr = await _communicate(process, max_output)
            returncode = await process.wait()
        finished = True
    finally:
        if not finished:
            _kill_group(process.pid)
        with anyio.CancelScope(shield=True):
            await process.aclose()
    return ProcessOutput(returncode, _decode(stdout), _decode(stderr))


async def _start(argv: Sequence[str]) -> Process:
    if not argv:
        raise ProgramNotFound("empty command")
    try:
        return await anyio.open_process(
            list(argv), stdin=subprocess.DEVNULL, start_new_session=True
        )
    except FileNotFoundError as exc:
        raise ProgramNotFound(f"{argv[0]}: not found") from exc
    except OSError as exc:  # EACCES, ENOEXEC, ...
        raise ProgramNotRunnable(f"{argv[0]}: {exc.strerror or exc}") from exc


async def _communicate(process: Process, limit: int) -> tuple[bytes, bytes]:
    """Drain stdout and stderr together (a full pipe would block the child)."""
    out, err = bytearray(), bytearray()
    async with anyio.create_task_group() as tg:
        if process.stdout is not None:
            tg.start_soon(_drain, process.stdout, out, limit)
        if process.stderr is not None:
            tg.start_soon(_drain, process.stderr, err, limit)
    return bytes(out), bytes(err)


async def _drain(stream: ByteReceiveStream, into: bytearray, limit: int) -> None:
    async for chunk in stream:
        if len(into) < limit:
            into.extend(chunk[: limit - len(into)])


def _kill_group(pgid: int) -> None:
    # The program leads its own session, so its pid is the group id; the group
    # outlives the leader while any grandchild remains, so this reaches them too.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")
