"""The simulated machine's control file: lines appended to it change the machine as
pynvml sees it, a bad line changes nothing, and an agent process on the machine turns
an XID written there into EVICT."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import anyio
import pynvml
import pytest

from healthd.sim.apiserver import ApiEmulator
from healthd.sim.control import POLL_S
from healthd.sim.node import simulate
from tests.agent.harness import KEYS, NODE, eventually, node_object
from tests.agent.test_process import clean_env


def _append(path: Path, *commands: object) -> None:
    with open(path, "a") as handle:
        for command in commands:
            handle.write((command if isinstance(command, str) else json.dumps(command)) + "\n")


def _pending(gpu: int) -> bool:
    handle = pynvml.nvmlDeviceGetHandleByIndex(gpu)
    return bool(pynvml.nvmlDeviceGetRemappedRows(handle)[2])  # isPending


def _until(predicate: object, timeout_s: float = 20 * POLL_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(POLL_S / 4)
    return False


def test_lines_change_the_machine_and_bad_lines_change_nothing(tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture
                                                               ) -> None:
    control = tmp_path / "control.jsonl"
    with simulate("healthy-8xh100", control):
        pynvml.nvmlInit()
        try:
            assert not _pending(2)
            _append(control, "not json", {"op": "explode"},
                    {"op": "inject", "fault": {"gpu": 99}})
            _append(control, {"op": "inject", "fault": {"gpu": 2,
                                                        "remapped_rows": {"pending": True}}})
            assert _until(lambda: _pending(2))
            assert not _pending(1)
            _append(control, {"op": "clear_faults", "gpu": 2})
            assert _until(lambda: not _pending(2))
        finally:
            pynvml.nvmlShutdown()
    skipped = [r.getMessage() for r in caplog.records if "sim control: skipped" in r.getMessage()]
    assert len(skipped) == 3, skipped


def test_what_the_file_held_at_start_holds_from_the_first_query(tmp_path: Path) -> None:
    control = tmp_path / "control.jsonl"
    _append(control, {"op": "inject", "fault": {"gpu": 5, "remapped_rows": {"pending": True}}})
    with simulate("healthy-8xh100", control):
        pynvml.nvmlInit()
        try:
            assert _pending(5)
        finally:
            pynvml.nvmlShutdown()


@pytest.mark.anyio
async def test_an_xid_written_to_the_control_file_makes_the_agent_process_evict(
        api: ApiEmulator, tmp_path: Path) -> None:
    api.seed(node_object())
    control = tmp_path / "control.jsonl"
    config = tmp_path / "healthd.yaml"
    config.write_text("checks:\n  remapped: {interval: 1s}\nagent: {jitter: 0}\n")
    argv = [sys.executable, "-m", "healthd.cli", "agent", "--sim", "healthy-8xh100",
            "--sim-control", str(control), "--kubeconfig",
            str(api.write_kubeconfig(tmp_path / "kubeconfig")), "--node", NODE,
            "--http-port", "0", "--config", str(config)]

    def label() -> str | None:
        return api.get("Node", NODE)["metadata"].get("labels", {}).get(KEYS.gpuhealth)

    async with await anyio.open_process(argv, env=clean_env(tmp_path)) as proc:
        try:
            await eventually(lambda: label() == "PASS", 30, "the first verdict PASS")
            _append(control, {"op": "emit_xid", "gpu": 3, "code": 79})
            await eventually(lambda: label() == "EVICT", 30, "EVICT after XID 79")
        finally:
            proc.kill()
