"""`healthd status` and `healthd trigger` as processes whose output is piped (a log,
`| tee`, CI): Ctrl-C ends `status --watch` cleanly; a watched status prints a
frame only when something in it changed; `trigger` prints each node's line as it
answers, not everything at the end."""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path

import anyio
import pytest
import yaml
from anyio.abc import ByteReceiveStream, Process

from healthd.sim.apiserver import ApiEmulator
from tests.fleet.fleetlab import KEYS, agent_pod, gpu_node, running_agents

pytestmark = pytest.mark.anyio

HEALTHD = [sys.executable, "-m", "healthd.cli"]


class Lines:
    """Lines of a child's output as they come."""

    def __init__(self, stream: ByteReceiveStream) -> None:
        self.stream, self.pending, self.lines = stream, b"", list[str]()

    async def next(self, timeout_s: float = 30) -> str:
        with anyio.fail_after(timeout_s):
            while b"\n" not in self.pending:
                self.pending += await self.stream.receive()
        line, self.pending = self.pending.split(b"\n", 1)
        self.lines.append(line.decode())
        return self.lines[-1]

    async def collect(self, seconds: float) -> list[str]:
        """Every line that comes within `seconds` (or until the output ends)."""
        got = []
        with anyio.move_on_after(seconds), suppress(anyio.EndOfStream):
            while True:
                got.append(await self.next(seconds + 1))
        return got


@asynccontextmanager
async def healthd(api: ApiEmulator, tmp_path: Path, *argv: str) -> AsyncIterator[Process]:
    kubeconfig = api.write_kubeconfig(tmp_path / "admin.kubeconfig")
    async with await anyio.open_process([*HEALTHD, *argv, "--kubeconfig", str(kubeconfig)]) \
            as proc:
        try:
            yield proc
        finally:
            if proc.returncode is None:
                proc.kill()


async def test_ctrl_c_ends_status_watch_cleanly(api: ApiEmulator, tmp_path: Path) -> None:
    api.seed(gpu_node("gpu-a", verdict="PASS"))
    async with healthd(api, tmp_path, "status", "--watch") as proc:
        assert proc.stdout is not None and proc.stderr is not None
        out = Lines(proc.stdout)
        while not (await out.next()).startswith("gpu-a "):
            pass
        proc.send_signal(signal.SIGINT)
        with anyio.fail_after(10):
            code = await proc.wait()
        errors = (await proc.stderr.receive()).decode() if code else ""
    assert code == 0, errors


async def test_a_piped_watch_prints_a_frame_only_on_a_change(api: ApiEmulator,
                                                             tmp_path: Path) -> None:
    api.seed(gpu_node("gpu-a", verdict="PASS"), agent_pod("gpu-a"),
             {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
              "metadata": {"name": "healthd-controller", "namespace": "healthd-system"},
              "spec": {"holderIdentity": "ctl-0", "leaseDurationSeconds": 15,
                       "renewTime": "2026-01-01T00:00:00.000000Z"}})
    async with healthd(api, tmp_path, "status", "--watch", "-o", "json") as proc:
        assert proc.stdout is not None
        out = Lines(proc.stdout)
        first = json.loads(await out.next())
        assert first["nodes"][0]["verdict"] == "PASS"
        for second in range(1, 6):  # the leader renews its Lease: nothing to show
            lease = api.get("Lease", "healthd-controller", "healthd-system")
            lease["spec"]["renewTime"] = f"2026-01-01T00:00:0{second}.000000Z"
            api.put(lease)
            await anyio.sleep(0.2)
        assert await out.collect(1.5) == []
        node = api.get("Node", "gpu-a")
        node["metadata"]["labels"][KEYS.gpuhealth] = "WARN"
        api.put(node)
        [frame] = await out.collect(2.0)
    assert json.loads(frame)["nodes"][0]["verdict"] == "WARN"


async def test_piped_trigger_prints_each_node_as_it_answers_on_stderr(
        api: ApiEmulator, tmp_path: Path) -> None:
    api.seed(gpu_node("gpu-a"), gpu_node("gpu-z"))  # gpu-z has no agent: it never answers
    async with running_agents(api, tmp_path, ["gpu-a"]), healthd(
            api, tmp_path, "trigger", "--nodes", "gpu-a,gpu-z", "--checks", "remapped",
            "--wait", "--timeout", "8s") as proc:
        assert proc.stdout is not None and proc.stderr is not None
        out, err = Lines(proc.stdout), Lines(proc.stderr)
        first = await err.next(timeout_s=6)
        assert proc.returncode is None  # gpu-z still has seconds to go
        with anyio.fail_after(30):
            code = await proc.wait()
        rest = await err.collect(1.0)
        table = await out.collect(1.0)
    assert first.startswith("gpu-a: PASS (before ") and "remapped=PASS" in first
    assert rest[0].startswith("gpu-z: no agent answered within 8s")
    assert code == 3
    assert table[0].split()[:2] == ["NODE", "BEFORE"]  # stdout holds the table alone


async def test_status_prints_yaml(api: ApiEmulator, tmp_path: Path) -> None:
    api.seed(gpu_node("gpu-a", verdict="PASS"))
    kubeconfig = api.write_kubeconfig(tmp_path / "admin.kubeconfig")
    proc = await anyio.run_process([*HEALTHD, "status", "-o", "yaml", "--kubeconfig",
                                    str(kubeconfig)], check=False)
    doc = yaml.safe_load(proc.stdout)
    assert proc.returncode == 0 and doc["nodes"][0]["name"] == "gpu-a"
    assert doc["summary"]["nodes"] == 1
