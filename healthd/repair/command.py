"""`healthd gpu-reset [--] UUID...`: reset GPUs in place, as the controller's GPU-reset
Job runs it on the node (healthd.controller.repairs), letting go of them first.

nvidia-smi resets a GPU only when nothing holds it: no process, no NVML client (this
command included) and no persistence mode, which the driver counts as a client. So,
for the GPUs named (each once, in the order given):

1. with NVML open, it names what holds each GPU (healthd.repair.holders) and turns
   persistence mode off where it is on (`nvmlDeviceSetPersistenceMode`, what
   `nvidia-smi -pm 0` does);
2. it shuts NVML down (its own session would hold every GPU) and runs
   `nvidia-smi --gpu-reset -i UUID` for each GPU, one at a time: a failure on one
   must not hide the others' results. Where NVML says a GPU cannot be reset alone
   (an A100 on NVSwitches, GPUs joined by NVLink before Ampere: checks.nvml_reset),
   it lets go of every GPU of the board and runs one `nvidia-smi --gpu-reset` for
   all of them, reporting each (the Job holds every GPU of the node, so none is in a
   pod's use);
3. whatever happened (a refusal, a failure, an exception), it turns persistence mode
   back on for exactly the GPUs it turned it off for, and reads each GPU back through
   NVML: a GPU is reset only if it then answers with its UUID.

It prints one line per GPU, then the result as one line of JSON (the shape and the
outcomes `reset`, `refused`, `failed`: healthd.repair.report), which it also writes to
`--termination-log PATH` (the Job's /dev/termination-log) for the controller:

    {"ok": false, "outcome": "refused", "gpus": [{"uuid": "GPU-...",
     "outcome": "refused", "exit_code": 255, "output": "... In use by another client ...",
     "holders": ["pid 4242 (dcgm-exporter): /dev/nvidia3 open"],
     "persistence_restored": true}]}

Exit status: 0 every GPU was reset; 75 (EX_TEMPFAIL) some were refused and none
failed: worth trying again once what holds them lets go; 1 some failed; 64 a usage
error, which runs nothing: a GPU is named by its NVML UUID
(`GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, or `MIG-...`), so an option passed as a
GPU after `--` (`-- --nvidia-smi=/bin/true`) is refused.

`--holders-only` resets and changes nothing: it prints, as one line of JSON, what
holds each GPU, `{"ok": bool, "gpus": [{"uuid", "minor", "persistence_mode",
"holders", "problem"}]}` (exit 0 when NVML found every GPU, else 1): what a real GPU
whose reset is not wanted can be asked.

With `--sim SPEC --sim-control FILE` the same code runs on a simulated machine: the
real pynvml over the fake NVML library, the simulated nvidia-smi, and the machine's
holder registry in place of /proc (healthd.sim.holders).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from checks.nvml_reset import GpuView, NvmlGpus, NvmlUnavailable
from healthd.repair.holders import (
    DEV,
    LET_GO,
    PERSISTENCE_MODE,
    DeviceUsers,
    ProcDeviceUsers,
    holders,
)
from healthd.repair.report import OUTPUT_CHARS, GpuResult, ResetReport, encode, outcome_of
from healthd.util.exits import UsageError

RESET_TIMEOUT_S = 120.0  # a reset that takes longer is stuck: the driver is wedged
EX_TEMPFAIL = 75  # sysexits.h: a temporary failure, try again later
_UUID = "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
GPU_UUID = re.compile(rf"GPU-{_UUID}|MIG-{_UUID}|MIG-GPU-{_UUID}/\d+/\d+")


class SimulatedMachine(Protocol):
    """What `healthd gpu-reset --sim` needs of a simulated machine
    (healthd.sim.node.SimulatedNode)."""

    def nvidia_smi(self) -> list[str]:
        """The command standing in for nvidia-smi there."""
        ...

    def device_users(self) -> DeviceUsers:
        """Who has its GPU device files open, in place of /proc."""
        ...


Simulate = Callable[[str], AbstractContextManager[SimulatedMachine]]


@dataclass(frozen=True)
class Node:
    """What the command works with: the node's NVML, its /proc view and nvidia-smi."""

    users: DeviceUsers
    nvidia_smi: Sequence[str]
    timeout_s: float = RESET_TIMEOUT_S
    nvml: NvmlGpus = field(default_factory=NvmlGpus)
    dev: Path = DEV


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("uuids", nargs="+", metavar="UUID",
                        help="GPUs to reset, by NVML UUID (GPU-...); put -- before them")
    parser.add_argument("--nvidia-smi", default="nvidia-smi", metavar="PATH",
                        help="the nvidia-smi executable (default: from PATH)")
    parser.add_argument("--termination-log", metavar="PATH",
                        help="also write the result there as one line of JSON")
    parser.add_argument("--timeout", type=float, default=RESET_TIMEOUT_S, metavar="S",
                        help="seconds one GPU's reset may take")
    parser.add_argument("--holders-only", action="store_true",
                        help="only say what holds each GPU (JSON); reset and change nothing")
    parser.add_argument("--sim", metavar="SPEC",
                        help="reset GPUs of a simulated machine (YAML file or bundled name)")
    parser.add_argument("--sim-control", metavar="FILE",
                        help="with --sim: the machine FILE names (healthd agent --sim-control)")


def targets(given: Sequence[str]) -> list[str]:
    """The GPUs to work on, each once, in the order given (UsageError for a name that
    is not an NVML UUID)."""
    wrong = [name for name in given if not GPU_UUID.fullmatch(name)]
    if wrong:
        raise UsageError(f"not a GPU UUID: {', '.join(map(repr, wrong))}; GPUs are named by "
                         "UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx), as nvidia-smi -L "
                         "shows them")
    return list(dict.fromkeys(given))


def run_nvidia_smi(command: Sequence[str], uuid: str | None,
                   timeout_s: float) -> tuple[int | None, str]:
    """`nvidia-smi --gpu-reset -i UUID` (without `-i` for None: every GPU of the board):
    its exit status (None: it did not finish or could not start) and what it said."""
    which = ["-i", uuid] if uuid is not None else []
    try:
        proc = subprocess.run([*command, "--gpu-reset", *which], capture_output=True,
                              text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return None, f"no answer within {timeout_s:g} s"
    except OSError as exc:
        return None, f"cannot run {command[0]}: {exc}"
    return proc.returncode, (proc.stdout + proc.stderr).strip()


@dataclass
class _Reset:
    """One run's state: what was found, what was turned off (to turn on again), what
    nvidia-smi said, what NVML answered afterwards."""

    views: dict[str, GpuView] = field(default_factory=dict)
    holders: dict[str, list[str]] = field(default_factory=dict)
    turned_off: list[str] = field(default_factory=list)
    runs: dict[str, tuple[int | None, str]] = field(default_factory=dict)
    restored: dict[str, bool] = field(default_factory=dict)
    answers: dict[str, str] = field(default_factory=dict)
    together: str = ""  # why the whole board is reset at once ("": each GPU alone)
    board: list[str] = field(default_factory=list)  # then: every GPU of it


def look(node: Node, uuids: Sequence[str], state: _Reset, *, let_go: bool) -> None:
    """With NVML open: each GPU's view and holders, and (`let_go`) persistence mode
    turned off where it is on. Without NVML, the GPUs say why."""
    try:
        with node.nvml.session():
            for uuid in uuids:
                _look_at(node, uuid, state, let_go=let_go)
            together = next((v.together for v in state.views.values() if v.together), "")
            if let_go and together:  # the board resets as one: let go of all of it
                state.together, state.board = together, node.nvml.board() or list(uuids)
                for uuid in state.board:
                    if uuid not in state.views:
                        _look_at(node, uuid, state, let_go=True)
    except NvmlUnavailable as exc:
        for uuid in uuids:
            state.views.setdefault(uuid, GpuView(uuid, problem=str(exc)))
            state.holders.setdefault(uuid, [])


def _look_at(node: Node, uuid: str, state: _Reset, *, let_go: bool) -> None:
    view = state.views[uuid] = node.nvml.view(uuid)
    state.holders[uuid] = holders(view, node.users, own_pid=os.getpid(), dev=node.dev)
    if let_go and view.persistence:
        _persistence_off(node, uuid, state)


def _persistence_off(node: Node, uuid: str, state: _Reset) -> None:
    why = node.nvml.set_persistence(uuid, False)
    if why:
        view = state.views[uuid]
        state.views[uuid] = GpuView(view.uuid, view.minor, view.persistence, view.processes,
                                    "; ".join(filter(None, [view.problem, why])))
    else:
        state.turned_off.append(uuid)
        state.holders[uuid] = [LET_GO if h == PERSISTENCE_MODE else h
                               for h in state.holders[uuid]]


def afterwards(node: Node, state: _Reset) -> None:
    """Persistence mode back on where it was turned off, and each GPU nvidia-smi
    reset read back through NVML."""
    try:
        with node.nvml.session():
            for uuid in state.turned_off:
                state.restored[uuid] = not node.nvml.set_persistence(uuid, True)
            for uuid, (code, _output) in state.runs.items():
                if code == 0:
                    state.answers[uuid] = node.nvml.answers(uuid)
    except NvmlUnavailable as exc:
        state.restored |= {u: False for u in state.turned_off if u not in state.restored}
        state.answers |= {u: str(exc) for u, (c, _) in state.runs.items() if c == 0}


def reset_gpus(node: Node, uuids: Sequence[str]) -> ResetReport:
    """Let go of `uuids`, reset each, put back what was let go (module docstring)."""
    state = _Reset()
    try:
        look(node, uuids, state, let_go=True)
        if state.together:  # one reset of every GPU of the board, said for each
            code, output = run_nvidia_smi(node.nvidia_smi, None, node.timeout_s)
            said = f"reset with every GPU of the board ({state.together}): {output}"
            state.runs = dict.fromkeys(state.board, (code, said))
        for uuid in uuids:
            if uuid not in state.runs:
                state.runs[uuid] = run_nvidia_smi(node.nvidia_smi, uuid, node.timeout_s)
    finally:
        afterwards(node, state)
    return ResetReport.of([_result(uuid, state) for uuid in state.runs])


def _result(uuid: str, state: _Reset) -> GpuResult:
    code, output = state.runs[uuid]
    answers = state.answers.get(uuid, "")
    if code == 0 and answers:
        output = f"{output}\nbut NVML cannot read it back: {answers}"
    return GpuResult(uuid, outcome_of(code, output, answers), code, output[:OUTPUT_CHARS],
                     tuple(state.holders.get(uuid, ())), state.restored.get(uuid))


def holder_report(node: Node, uuids: Sequence[str]) -> dict[str, object]:
    """What holds each GPU, changing nothing (`--holders-only`)."""
    state = _Reset()
    look(node, uuids, state, let_go=False)
    gpus = [{"uuid": uuid, "minor": state.views[uuid].minor,
             "persistence_mode": state.views[uuid].persistence,
             "holders": state.holders[uuid], "problem": state.views[uuid].problem}
            for uuid in uuids]
    return {"ok": all(state.views[u].minor is not None for u in uuids), "gpus": gpus}


def exit_status(report: ResetReport) -> int:
    return {"reset": 0, "refused": EX_TEMPFAIL}.get(report.outcome, 1)


def run(args: argparse.Namespace, simulate: Simulate | None = None) -> int:
    uuids = targets(args.uuids)
    if simulate is None:
        node = Node(ProcDeviceUsers(), shlex.split(args.nvidia_smi), args.timeout)
        return _serve(node, uuids, args)
    with simulate(args.sim) as machine:
        return _serve(Node(machine.device_users(), machine.nvidia_smi(), args.timeout),
                      uuids, args)


def _serve(node: Node, uuids: Sequence[str], args: argparse.Namespace) -> int:
    if args.holders_only:
        found = holder_report(node, uuids)
        _emit(json.dumps(found, separators=(",", ":")), args.termination_log)
        return 0 if found["ok"] else 1
    report = reset_gpus(node, uuids)
    for result in report.gpus:
        print(f"{result.outcome}: {result.summary()}")
    _emit(encode(report), args.termination_log)
    return exit_status(report)


def _emit(line: str, termination_log: str | None) -> None:
    print(line)
    if termination_log:
        Path(termination_log).write_text(line + "\n")
