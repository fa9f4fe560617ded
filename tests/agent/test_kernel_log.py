"""The kernel log on a running agent: an XID 79 logged while the agent was stopped is
EVICT once it starts again (as a live one is), and a fatal NVSwitch SXID reaches the
label with its documented verdict, EVICT, without waiting for the sxid check's next
periodic run (the agent watches the log); garbage lines are counted in a metric by
reason, logged once per reason, and judged never: the agent reads on past them."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from checks import kernel_log
from checks.kernel_log import MAX_RECORD, SKIP_REASONS, SkippedLines
from healthd.config import Config
from healthd.sim.apiserver import ApiEmulator
from healthd.sim.kernellog import SimKernelLog
from healthd.sim.machine import FabricSpec, load_machine_spec
from tests.agent.harness import (
    KEYS,
    NODE,
    eventually,
    fast_config,
    running_agent,
    with_intervals,
)

pytestmark = pytest.mark.anyio

# GPU 5 of a simulated 8-GPU machine sits on bus 0x68 (00000000:68:00.0).
XID79_GPU5 = ("NVRM: Xid (PCI:0000:68:00): 79, pid='<unknown>', name=<unknown>, "
              "GPU has fallen off the bus.")
FATAL_SXID = "nvidia-nvswitch2: SXid (PCI:0000:8a:00.0): 22003, Fatal, Link 12 Minion Halt"


def findings(h: Any) -> list[dict[str, Any]]:
    return list(json.loads(h.annotations()[KEYS.health])["held"])


def with_log(log: SimKernelLog, state: Path, **intervals: float) -> Config:
    config = fast_config(kernel_log={"path": str(log.path), "state_file": str(state)})
    return with_intervals(config, **intervals)


async def test_an_xid_logged_while_the_agent_was_stopped_is_evict_after_it_starts(
        api: ApiEmulator, tmp_path: Path) -> None:
    log = SimKernelLog(tmp_path / "kmsg", lambda: 3600.0)
    log.write_history(["Linux version 6.8.0 (boot)"])
    config = with_log(log, tmp_path / "state" / "kmsg-position.json")
    async with running_agent(api, tmp_path, config=config) as h:
        await eventually(lambda: h.verdict() == "PASS", what="PASS label")
    log.append(XID79_GPU5)  # the agent is down: no NVML event reaches anyone
    async with running_agent(api, tmp_path, config=config, seed=False) as h:
        await eventually(lambda: h.verdict() == "EVICT", what="EVICT label")
        assert ("XID_79", "gpu5") in [(f["code"], f["entity"]) for f in findings(h)]


async def test_a_fatal_sxid_is_evict_without_waiting_for_a_periodic_run(
        api: ApiEmulator, tmp_path: Path) -> None:
    log = SimKernelLog(tmp_path / "kmsg", lambda: 3600.0)
    config = with_log(log, tmp_path / "kmsg-position.json", sxid=3600.0)
    hgx = load_machine_spec("healthy-8xh100").model_copy(update={"fabric": FabricSpec()})
    async with running_agent(api, tmp_path, config=config, spec=hgx) as h:
        await eventually(lambda: h.verdict() == "PASS", what="PASS label")
        log.append(FATAL_SXID)
        await eventually(lambda: h.verdict() == "EVICT", timeout_s=10, what="EVICT label")
        assert h.metric("healthd_check_runs_total", node=NODE, check="sxid",
                        result="EVICT") == 1
        (held,) = [f for f in findings(h) if f["code"] == "SXID_22003"]
        assert held["entity"] == "nvswitch/nvswitch2"


# One line of each kind of garbage the reader tells apart: raw bytes, then messages in
# well-formed records in which no XID or SXID can be read.
RAW_GARBAGE = (b"4,9001,1000,-;" + b"x" * MAX_RECORD, b"no record header here")
UNREADABLE = ("NVRM: Xid (PCI:0000:68:00): seventy-nine, GPU has fallen off the bus.",
              "nvidia-nvswitch2: SXid (PCI:0000:8a:00.0): Fatal", b"\xff\xfe not UTF-8")


async def test_an_xid_79_whose_process_name_is_not_utf8_is_evict(
        api: ApiEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A syslog file or a journal export keeps a process name's bytes as they were:
    the XID is judged by its header and code, and nothing is counted as skipped."""
    monkeypatch.setattr(kernel_log, "SKIPPED", SkippedLines())  # this test's tally only
    log = SimKernelLog(tmp_path / "kmsg", lambda: 3600.0)
    config = with_log(log, tmp_path / "kmsg-position.json")
    async with running_agent(api, tmp_path, config=config) as h:
        await eventually(lambda: h.verdict() == "PASS", what="PASS label")
        log.append(XID79_GPU5.encode().replace(b"name=<unknown>", b"name=\xff\xfe-job"))
        await eventually(lambda: h.verdict() == "EVICT", what="EVICT label")
        assert [(f["code"], f["entity"]) for f in findings(h)] == [("XID_79", "gpu5")]
        assert h.metric("healthd_kernel_log_skipped_lines_total", node=NODE,
                        reason="not_utf8") == 0


async def test_garbage_lines_are_counted_logged_once_and_never_judged(
        api: ApiEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(kernel_log, "SKIPPED", SkippedLines())  # this test's tally only
    log = SimKernelLog(tmp_path / "kmsg", lambda: 3600.0)
    config = with_log(log, tmp_path / "kmsg-position.json")
    caplog.set_level(logging.WARNING, logger="checks.kernel_log")
    async with running_agent(api, tmp_path, config=config) as h:
        await eventually(lambda: h.verdict() == "PASS", what="PASS label")
        for _ in range(2):
            with log.path.open("ab") as raw:
                raw.write(b"\n".join(RAW_GARBAGE) + b"\n")
            for message in UNREADABLE:
                log.append(message)
        log.append(XID79_GPU5)  # the reader goes on past the garbage to a real fault
        await eventually(lambda: h.verdict() == "EVICT", what="EVICT label")
        assert [(f["code"], f["entity"]) for f in findings(h)] == [("XID_79", "gpu5")]
        counts = {reason: h.metric("healthd_kernel_log_skipped_lines_total", node=NODE,
                                   reason=reason) for reason in SKIP_REASONS}
        assert counts == dict.fromkeys(SKIP_REASONS, 2.0)
        assert h.agent.healthy() == (True, "ok")
    warned = [r.getMessage() for r in caplog.records
              if r.name == "checks.kernel_log" and r.levelno == logging.WARNING]
    assert len(warned) == len(SKIP_REASONS), warned
