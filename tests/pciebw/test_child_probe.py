"""The agent's side of the child probe, with real child processes (small shell
programs standing in for the CUDA child): an answer is the measurement; garbage, a
death, a failed exit, a hang past the deadline or a program that cannot start is
UNKNOWN with what happened, never PASS; a hung child and what it started are killed."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import anyio
import pytest

from checks.base import CheckResult, Severity, run_check
from checks.pciebw import PcieBwCheck
from checks.pciebw_probe import ChildBandwidthProbe
from checks.probes import Probes
from healthd.sim.cuda import SimBandwidthProbe
from healthd.sim.machine import parse_machine_spec
from tests.checks.gpufakes import context, entity_status, node

from .fakes import FakeActivity

pytestmark = pytest.mark.anyio
MIB = 1 << 20


def shell(script: str) -> ChildBandwidthProbe:
    """A probe whose child is `sh -c script` (the bus id is its $1)."""
    def command(pci_bus_id: str, size_bytes: int, iterations: int) -> Sequence[str]:
        return ["sh", "-c", script, "probe", pci_bus_id]
    return ChildBandwidthProbe(command)


async def judge(probe: ChildBandwidthProbe, count: int = 1, **params: object) -> CheckResult:
    check = PcieBwCheck(params, probes=Probes(bandwidth=probe, gpu_activity=FakeActivity()))
    return await run_check(check, context(node(count=count)), timeout_s=20)


def alive(pid: int) -> bool:
    """Whether `pid` still runs (a zombie has ended: it holds nothing any more)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


async def test_an_answer_line_is_the_measurement() -> None:
    result = await judge(shell('echo \'{"h2d_gbps": 9.5, "d2h_gbps": 52.0, "pid": 77}\''))
    assert [f.code for f in result.findings] == ["PCIE_BW_LOW"]
    assert entity_status(result, 0).values["h2d_gbps"] == 9.5


@pytest.mark.parametrize(("script", "reason"), [
    ("echo all good", "the bandwidth probe printed no answer (not JSON"),
    ("kill -KILL $$", "the bandwidth probe was killed by SIGKILL"),
    ("echo 'Traceback (most recent call last):' >&2; echo 'MemoryError' >&2; exit 1",
     "the bandwidth probe exited with status 1: MemoryError"),
    ('echo \'{"h2d_gbps": 50, "d2h_gbps": 50}\'; exit 3',
     "the bandwidth probe exited with status 3"),
    ('echo \'{"error": "cuMemAlloc_v2 failed: CUDA_ERROR_OUT_OF_MEMORY", "pid": 5}\'',
     "cuMemAlloc_v2 failed: CUDA_ERROR_OUT_OF_MEMORY"),
], ids=["garbage", "killed", "crashed", "failed-exit", "cuda-error"])
async def test_a_child_without_an_answer_is_unknown_for_its_gpu(script: str, reason: str) -> None:
    result = await judge(shell(script), count=2)
    for gpu in (0, 1):
        row = entity_status(result, gpu)
        assert row.status is Severity.UNKNOWN and row.reason.startswith(reason), row.reason
    assert result.status is Severity.UNKNOWN and not result.findings


async def test_a_child_that_says_no_gpu_can_be_measured_ends_the_check() -> None:
    result = await judge(shell('echo \'{"error": "CUDA driver not found", "unavailable": true}\''),
                         count=2)
    assert (result.status, result.reason) == (Severity.UNKNOWN, "CUDA driver not found")


async def test_a_program_that_cannot_start_is_unknown() -> None:
    probe = ChildBandwidthProbe(lambda bus, size, n: ["/nonexistent/healthd-probe"])
    result = await judge(probe)
    assert result.status is Severity.UNKNOWN
    assert result.reason.startswith("cannot start the bandwidth probe: /nonexistent")


async def test_a_hung_child_and_what_it_started_are_killed_at_the_deadline(
        tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    hang = f"echo $$ > {pids}; sleep 60 & echo $! >> {pids}; wait"
    result = await judge(shell(hang), probe_timeout_s=0.5)
    row = entity_status(result, 0)
    assert row.status is Severity.UNKNOWN
    assert row.reason == "the bandwidth probe did not finish within 0.5 s (killed)"
    child, grandchild = (int(line) for line in pids.read_text().split())
    assert not alive(child)
    # The grandchild got its SIGKILL with the child's group; a loaded machine may take
    # a moment to end it (reparented, it is reaped by init, not by us).
    with anyio.fail_after(5):
        while alive(grandchild):
            await anyio.sleep(0.05)


async def test_the_simulated_child_answers_what_the_machine_measures() -> None:
    spec = parse_machine_spec({"gpus": {"count": 1},
                               "faults": [{"gpu": 0, "pcie_bandwidth_gbps": {"h2d": 9.0}}]})
    measured = await SimBandwidthProbe(spec).measure(spec.pci_bus_id(0), MIB, 1)
    assert (measured.h2d_gbps, round(measured.d2h_gbps, 2)) == (9.0, 53.56)
    assert measured.pid > 0 and measured.pid != os.getpid()  # measured in a child


# Runs a command from a parent of a few MiB and prints its exit status and peak RSS
# (KiB): wait4's peak counts the parent's pages at the fork, so not from this process.
LAUNCHER = (
    "import os, sys\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"
    "    os.execv(sys.argv[1], sys.argv[1:])\n"
    "_, status, usage = os.wait4(pid, 0)\n"
    "print(os.waitstatus_to_exitcode(status), usage.ru_maxrss)\n"
)


def test_the_simulated_child_holds_a_buffer_of_the_copy_size() -> None:
    spec = parse_machine_spec({"gpus": {"count": 1}})
    argv = SimBandwidthProbe(spec).command(spec.pci_bus_id(0), 256 * MIB, 5)
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", LAUNCHER, *argv],
                          capture_output=True, text=True, timeout=60, check=True)
    code, peak_kib = proc.stdout.split()[-2:]
    assert int(code) == 0
    assert int(peak_kib) * 1024 >= 256 * MIB
