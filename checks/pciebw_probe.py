"""Measuring one GPU's copy bandwidth in a child process: the agent's side.

`ChildBandwidthProbe` is the real `checks.probes.BandwidthProbe`. For each GPU it runs
a child program (checks.cuda_child; a simulation names its own stand-in) through
checks.processes: in its own process group, and when the caller's deadline passes or
the caller is cancelled, the whole group is killed and reaped before the caller goes
on. The agent thus never holds a CUDA context or a pinned buffer, and a copy hung on a
failing GPU leaves no thread behind.

What the child leaves decides the outcome, never more:

- exit 0 and one answer line (checks.cuda_child): the Bandwidth, or the child's error
  as ProbeError (ProbeUnavailable when it says no GPU on the node can be measured);
- anything else (no line, garbage, a non-zero exit, death by a signal, a program that
  cannot start): ProbeError saying what happened. Never a measurement, so never PASS.
"""

from __future__ import annotations

import math
import signal
from collections.abc import Callable, Sequence

import anyio

from checks import cuda_child
from checks.probes import Bandwidth, BandwidthProbe
from checks.processes import ProcessOutput, ProgramNotFound, ProgramNotRunnable, run_process

MAX_ANSWER_BYTES = 64 * 1024  # an answer is one short line; more is garbage anyway

Command = Callable[[str, int, int], Sequence[str]]
"""(PCI bus id, bytes per copy, copies per direction) -> the child's argv."""


class ProbeError(Exception):
    """This GPU could not be measured; `reason` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ProbeUnavailable(ProbeError):
    """No GPU on this node can be measured (no CUDA driver, cuInit failed)."""


def cuda_child_command(pci_bus_id: str, size_bytes: int, iterations: int) -> list[str]:
    """The real child: pinned copies through the CUDA driver (checks.cuda_child)."""
    return cuda_child.command("checks.cuda_child", pci_bus_id, str(size_bytes),
                              str(iterations))


class ChildBandwidthProbe:
    """Measures each GPU in a child started from `command` (see the module docstring).
    The deadline is the caller's (`measure_within`): cancelling `measure` kills the
    child and everything it started."""

    def __init__(self, command: Command = cuda_child_command) -> None:
        self.command = command

    async def measure(self, pci_bus_id: str, size_bytes: int, iterations: int) -> Bandwidth:
        argv = self.command(pci_bus_id, size_bytes, iterations)
        try:
            out = await run_process(argv, timeout_s=math.inf, max_output=MAX_ANSWER_BYTES)
        except (ProgramNotFound, ProgramNotRunnable) as exc:
            raise ProbeUnavailable(f"cannot start the bandwidth probe: {exc}") from exc
        return bandwidth_of(out)


def bandwidth_of(out: ProcessOutput) -> Bandwidth:
    """The measurement a finished child left, or ProbeError saying why there is none."""
    if out.returncode != 0:
        raise ProbeError(f"the bandwidth probe {_ended(out.returncode)}{_last_words(out)}")
    try:
        answer = cuda_child.decode(out.stdout)
    except ValueError as exc:
        raise ProbeError(f"the bandwidth probe printed no answer ({exc}): "
                         f"{out.stdout.strip()[:120]!r}") from None
    if answer.error:
        raise (ProbeUnavailable if answer.unavailable else ProbeError)(answer.error)
    return Bandwidth(answer.h2d_gbps, answer.d2h_gbps, pid=answer.pid)


async def measure_within(probe: BandwidthProbe, pci_bus_id: str, size_bytes: int,
                         iterations: int, timeout_s: float) -> Bandwidth:
    """`probe.measure` under a deadline: past it the measurement is cancelled (a child
    is killed) and this raises ProbeError."""
    with anyio.move_on_after(timeout_s):
        return await probe.measure(pci_bus_id, size_bytes, iterations)
    raise ProbeError(f"the bandwidth probe did not finish within {timeout_s:g} s (killed)")


def _ended(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with status {returncode}"


def _last_words(out: ProcessOutput) -> str:
    """The child's last line on stderr (a traceback's last line names the error)."""
    lines = out.stderr.strip().splitlines()
    return f": {lines[-1][:200]}" if lines else ""
