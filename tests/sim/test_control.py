"""The simulated machine's control file: lines appended to it change the machine as
pynvml and the RDMA sysfs reader see it, a bad line changes nothing, and an agent
process on the machine turns an XID written there into EVICT, and an RDMA port's
counters and state written there into its metrics and ERR."""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from pathlib import Path

import anyio
import pynvml
import pytest
from prometheus_client.parser import text_string_to_metric_families

from checks.probes import RdmaPort
from healthd.sim.apiserver import ApiEmulator
from healthd.sim.control import POLL_S
from healthd.sim.node import SimulatedNode, simulate
from tests.agent.harness import KEYS, NODE, eventually, node_object
from tests.agent.test_process import clean_env
from tests.realcluster.processes import free_port


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


# -- RDMA ports at run time -----------------------------------------------------------

RDMA_SPEC = {"node": "hgx", "rdma": {"devices": 2, "ports": [
    {"device": "mlx5_1", "counters": {"symbol_error": 3}}]}}


def rdma_machine(tmp_path: Path) -> Path:
    spec = tmp_path / "hgx.yaml"
    spec.write_text(json.dumps(RDMA_SPEC))  # YAML is a superset of JSON
    return spec


def ports(sim: SimulatedNode) -> dict[str, RdmaPort]:
    """The ports as the rdma check's sysfs reader sees them."""
    reader = sim.rdma_reader()
    assert reader is not None
    return {f"{p.device}/{p.port}": p for p in reader.read()}


def test_rdma_port_lines_change_a_port_and_bad_ones_change_nothing(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    control = tmp_path / "control.jsonl"
    with simulate(rdma_machine(tmp_path), control) as sim:
        assert ports(sim)["mlx5_0/1"].state == "ACTIVE"
        _append(control, {"op": "rdma_port", "device": "mlx5_9"},
                {"op": "rdma_port", "device": "mlx5_0", "netdev": "eth0"},
                {"op": "rdma_port", "device": "mlx5_0", "state": "down"},
                {"op": "rdma_port", "device": "mlx5_0", "counters": {"symbol_error": "many"}})
        _append(control, {"op": "rdma_port", "device": "mlx5_0", "state": "DOWN",
                          "phys_state": "Disabled"},
                {"op": "rdma_port", "device": "mlx5_1", "counters": {"symbol_error": 40}})
        assert _until(lambda: ports(sim)["mlx5_1/1"].counters["symbol_error"] == 40)
        assert (ports(sim)["mlx5_0/1"].state, ports(sim)["mlx5_0/1"].phys_state) == \
            ("DOWN", "Disabled")
        _append(control, {"op": "rdma_port", "device": "mlx5_0"})  # the cable is back
        assert _until(lambda: ports(sim)["mlx5_0/1"].state == "ACTIVE")
    skipped = [r.getMessage() for r in caplog.records if "sim control: skipped" in r.getMessage()]
    assert len(skipped) == 4, skipped
    assert "no RDMA port mlx5_9/1" in skipped[0] and "netdev" in skipped[1]


def symbol_errors(http_port: int, rdma_port: str) -> float | None:
    """What an agent's /metrics shows of an RDMA port's symbol_error counter (None:
    nothing yet, or the agent does not answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return None
    return next((s.value for family in text_string_to_metric_families(text)
                 for s in family.samples if s.name == "healthd_rdma_port_errors"
                 and s.labels.get("port") == rdma_port
                 and s.labels.get("counter") == "symbol_error"), None)


@pytest.mark.anyio
async def test_an_agent_process_sees_rdma_counters_grow_and_a_port_go_down(
        api: ApiEmulator, tmp_path: Path) -> None:
    api.seed(node_object())
    control, config, http = tmp_path / "control.jsonl", tmp_path / "healthd.yaml", free_port()
    config.write_text("checks:\n  rdma: {interval: 1s}\nagent: {jitter: 0}\n")
    argv = [sys.executable, "-m", "healthd.cli", "agent", "--sim", str(rdma_machine(tmp_path)),
            "--sim-control", str(control), "--kubeconfig",
            str(api.write_kubeconfig(tmp_path / "kubeconfig")), "--node", NODE,
            "--http-port", str(http), "--config", str(config)]

    def label() -> str | None:
        return api.get("Node", NODE)["metadata"].get("labels", {}).get(KEYS.gpuhealth)

    def errors() -> float | None:
        return symbol_errors(http, "mlx5_1/1")

    async with await anyio.open_process(argv, env=clean_env(tmp_path)) as proc:
        try:
            await eventually(lambda: label() == "PASS" and errors() == 3, 30,
                             "PASS, with the spec's counters")
            _append(control, {"op": "rdma_port", "device": "mlx5_1",
                              "counters": {"symbol_error": 500}})
            await eventually(lambda: errors() == 500, 30, "the counter grown to 500")
            _append(control, {"op": "rdma_port", "device": "mlx5_0", "state": "DOWN",
                              "phys_state": "Disabled"})
            await eventually(lambda: label() == "ERR", 30, "ERR once the port is down")
        finally:
            proc.kill()
