"""The dcgm check end to end through the real subprocess path: the check runs the
fake dcgmi, which replays recorded DCGM 3.x / 4.x outputs with their exit statuses.

Covers: pass (warnings kept as values), failures (fatal -> sticky EVICT, others ERR,
DCGM's error ids kept), isolate (205), runtime errors, garbage and other exits ->
UNKNOWN with the reason, banner noise, 3.x and 4.x agreeing, dcgmi or its host engine
missing (SKIPPED, actionable), `--host`, and the
whole process group dying on timeout and on cancellation."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from checks.base import CheckContext, CheckResult, Severity, run_check
from checks.dcgm import DcgmCheck
from healthd.sim.dcgm import DcgmSim, fake_dcgmi_command
from tests.dcgm.conftest import NODE, FakeCheck, by_code, statuses

pytestmark = pytest.mark.anyio

ALL_GPUS = {f"gpu{i}" for i in range(8)}


async def test_level1_pass_reports_every_gpu_with_level_and_version(
    fake_check: FakeCheck, ctx: CheckContext
) -> None:
    result = await run_check(fake_check("v4-pass-r1", level=1), ctx)
    assert result.status is Severity.PASS
    assert result.findings == ()
    assert statuses(result) == dict.fromkeys(ALL_GPUS, Severity.PASS)
    gpu0 = result.entities[0]
    assert gpu0.values["level"] == 1
    assert gpu0.values["dcgm_version"] == "4.2.3"


async def test_warn_result_raises_nothing_but_is_kept(
    fake_check: FakeCheck, ctx: CheckContext
) -> None:
    result = await run_check(fake_check("v4-pass-r3"), ctx)
    assert result.status is Severity.PASS
    assert result.findings == ()
    gpu4 = next(e for e in result.entities if e.entity.label == "gpu4")
    assert "MEMORY_BANDWIDTH" in str(gpu4.values["dcgm_warnings"])


async def test_failures_are_read_per_test_and_gpu(fake_check: FakeCheck, ctx: CheckContext) -> None:
    result = await run_check(fake_check("v4-fail-r3"), ctx)
    found = by_code(result)
    assert set(found) == {("DCGM_MEMORY", "gpu2"), ("DCGM_TARGETED_STRESS", "gpu5")}
    memory = found["DCGM_MEMORY", "gpu2"]
    assert (memory.severity, memory.sticky) == (Severity.EVICT, True)
    assert memory.values["error_id"] == 80
    assert memory.values["dcgm_severity"] == "TRIAGE"
    assert "row remapping failed" in memory.message
    stress = found["DCGM_TARGETED_STRESS", "gpu5"]
    assert (stress.severity, stress.sticky) == (Severity.ERR, False)
    assert stress.values["error_id"] == 50
    assert result.status is Severity.EVICT
    assert statuses(result)["gpu0"] is Severity.PASS
    assert "MEMORY" in result.reason


async def test_isolate_evicts_the_named_gpu(fake_check: FakeCheck, ctx: CheckContext) -> None:
    result = await run_check(fake_check("v4-isolate-pcie", level=2), ctx)
    found = by_code(result)
    assert set(found) == {("DCGM_ISOLATE", "gpu3"), ("DCGM_PCIE", "gpu3")}
    isolate = found["DCGM_ISOLATE", "gpu3"]
    assert (isolate.severity, isolate.sticky) == (Severity.EVICT, True)
    assert found["DCGM_PCIE", "gpu3"].values["error_id"] == 107
    assert statuses(result)["gpu2"] is Severity.PASS


async def test_isolate_exit_without_a_named_gpu_isolates_the_node(ctx: CheckContext) -> None:
    sim = DcgmSim(output="v4-pass-r1", exit=205)
    result = await run_check(DcgmCheck({"command": fake_dcgmi_command(sim)}), ctx)
    assert set(by_code(result)) == {("DCGM_ISOLATE", "node")}
    assert result.findings[0].entity.name == NODE
    assert result.status is Severity.EVICT


@pytest.mark.parametrize(
    ("output", "fake_args", "expected"),
    [
        ("v4-runtime-error", (), "GPUs are in use by another process"),
        ("garbage", (), "not valid JSON"),
        ("garbage", (), "segmentation fault"),  # what dcgmi printed is in the reason
        ("v4-pass-r3", ("--exit", "1"), "dcgmi exited 1"),
        ("v4-pass-r3", ("--exit", "1", "--stderr", "host engine unreachable"), "unreachable"),
        ("v4-fail-r3", ("--exit", "203"), "killed"),
    ],
)
async def test_cannot_tell_is_unknown_with_the_reason(
    fake_check: FakeCheck, ctx: CheckContext, output: str, fake_args: tuple[str, ...], expected: str
) -> None:
    result = await run_check(fake_check(output, *fake_args), ctx)
    assert result.status is Severity.UNKNOWN
    assert result.findings == ()
    assert expected in result.reason


async def test_banner_lines_around_the_json_are_ignored(
    fake_check: FakeCheck, ctx: CheckContext
) -> None:
    plain = await run_check(fake_check("v4-fail-r3"), ctx)
    noisy = await run_check(fake_check("v4-fail-r3", "--noise"), ctx)
    assert set(by_code(noisy)) == set(by_code(plain))
    assert len(noisy.findings) == 2


async def test_dcgm_3_and_4_give_the_same_codes(fake_check: FakeCheck, ctx: CheckContext) -> None:
    v3 = await run_check(fake_check("v3-fail-pcie", level=2), ctx)
    v4 = await run_check(fake_check("v4-fail-pcie", level=2), ctx)

    def seen(result: CheckResult) -> set[tuple[object, ...]]:
        return {
            (f.code, f.entity.label, f.severity, f.values.get("error_id")) for f in result.findings
        }

    assert seen(v3) == seen(v4) == {("DCGM_PCIE", "gpu1", Severity.EVICT, 107)}
    assert statuses(v3) == statuses(v4)


async def test_dcgm_3_pass(fake_check: FakeCheck, ctx: CheckContext) -> None:
    result = await run_check(fake_check("v3-pass"), ctx)
    assert result.status is Severity.PASS
    assert set(statuses(result)) == ALL_GPUS
    assert result.entities[0].values["dcgm_version"] == "3.3.9"


async def test_dcgmi_not_installed_is_skipped_with_what_to_set_up(ctx: CheckContext) -> None:
    check = DcgmCheck({"command": ["dcgmi-not-installed-here"]})
    result = await run_check(check, ctx)
    assert (result.status, result.actionable) == (Severity.SKIPPED, True)
    assert "'dcgmi-not-installed-here' is not installed" in result.reason
    assert "host_engine" in result.reason and "enabled: false" in result.reason


async def test_the_host_engine_is_passed_to_dcgmi(
        fake_check: FakeCheck, ctx: CheckContext) -> None:
    remote = fake_check("v4-pass-r1", "--host-engine", "10.0.0.5:5555", level=1,
                        host_engine="10.0.0.5:5555")
    assert remote.argv()[-6:] == ["diag", "--host", "10.0.0.5:5555", "-r", "1", "-j"]
    assert (await run_check(remote, ctx)).status is Severity.PASS


@pytest.mark.parametrize("host_engine", [None, "10.0.0.6:5555"])
async def test_no_host_engine_is_skipped_with_the_address_tried(
        fake_check: FakeCheck, ctx: CheckContext, host_engine: str | None) -> None:
    check = fake_check("v4-pass-r1", "--host-engine", "none", level=1,
                       host_engine=host_engine)
    result = await run_check(check, ctx)
    assert (result.status, result.actionable) == (Severity.SKIPPED, True)
    assert f"no host engine answers at {host_engine or 'localhost:5555'}" in result.reason
    assert "unable to establish a connection" in result.reason  # dcgmi's own words


async def test_a_runtime_error_with_a_host_engine_stays_unknown(
        fake_check: FakeCheck, ctx: CheckContext) -> None:
    """Only 'DCGM cannot be used here' is SKIPPED; a failing diagnostic is not."""
    result = await run_check(fake_check("v4-runtime-error", level=1), ctx)
    assert (result.status, result.actionable) == (Severity.UNKNOWN, False)


def _pids(pid_file: Path) -> list[int]:
    return [int(line) for line in pid_file.read_text().split()] if pid_file.exists() else []


def _running(pid: int) -> bool:
    """Alive and not a zombie (a killed grandchild may wait for a reaper)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


async def _assert_all_gone(pids: list[int]) -> None:
    with anyio.fail_after(5):  # loose upper bound: SIGKILL lands at once
        while any(_running(p) for p in pids):
            await anyio.sleep(0.02)


def _hanging(fake_check: FakeCheck, pid_file: Path, **params: object) -> DcgmCheck:
    args = ("--sleep", "inf", "--grandchild", "--pid-file", str(pid_file))
    return fake_check("v4-pass-r3", *args, **params)


async def test_timeout_kills_the_whole_process_group(
    fake_check: FakeCheck, ctx: CheckContext, tmp_path: Path
) -> None:
    pid_file = tmp_path / "pids"
    result = await run_check(_hanging(fake_check, pid_file, timeout_s=2.0), ctx)
    assert result.status is Severity.UNKNOWN
    assert "timed out after 2 s" in result.reason
    pids = _pids(pid_file)
    assert len(pids) == 2  # the fake dcgmi and its grandchild
    await _assert_all_gone(pids)


async def test_cancellation_kills_the_whole_process_group(
    fake_check: FakeCheck, ctx: CheckContext, tmp_path: Path
) -> None:
    pid_file = tmp_path / "pids"
    check = _hanging(fake_check, pid_file)
    async with anyio.create_task_group() as tg:
        tg.start_soon(run_check, check, ctx)
        with anyio.fail_after(10):
            while len(_pids(pid_file)) < 2:
                await anyio.sleep(0.02)
        assert all(_running(p) for p in _pids(pid_file))
        tg.cancel_scope.cancel()
    await _assert_all_gone(_pids(pid_file))


async def test_run_check_deadline_shorter_than_the_level_is_unknown(
    fake_check: FakeCheck, ctx: CheckContext, tmp_path: Path
) -> None:
    pid_file = tmp_path / "pids"
    result = await run_check(_hanging(fake_check, pid_file), ctx, timeout_s=1.5)
    assert result.status is Severity.UNKNOWN
    assert "timed out" in result.reason
    assert len(_pids(pid_file)) == 2
    await _assert_all_gone(_pids(pid_file))


async def test_dcgmi_that_cannot_be_started(ctx: CheckContext, tmp_path: Path) -> None:
    not_executable = tmp_path / "dcgmi"
    not_executable.write_text("#!/bin/sh\n")
    result = await run_check(DcgmCheck({"command": [str(not_executable)]}), ctx)
    assert result.status is Severity.UNKNOWN
    assert "cannot be started" in result.reason
