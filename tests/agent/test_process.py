"""`healthd agent` as a process: it runs against the API over a kubeconfig on a
simulated machine with the default set of checks, stops within 10 s of SIGTERM with
exit 0, logs JSON lines with the node, and refuses a bad config or spec with exit 78
naming what is wrong."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from healthd.sim.apiserver import ApiEmulator
from tests.agent.harness import KEYS, NODE, eventually, node_object

HEALTHD = [sys.executable, "-m", "healthd.cli"]


def clean_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "NODE_NAME")}
    env["HOME"] = str(tmp_path)  # no ~/.kube/config to fall back on
    return env


@pytest.mark.anyio
async def test_sigterm_stops_the_agent_cleanly_within_ten_seconds(api: ApiEmulator,
                                                                   tmp_path: Path) -> None:
    api.seed(node_object())
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    config = tmp_path / "healthd.yaml"
    config.write_text("checks:\n  remapped: {interval: 1s}\nagent: {jitter: 0}\n")
    argv = [*HEALTHD, "agent", "--sim", "healthy-8xh100", "--kubeconfig", str(kubeconfig),
            "--node", NODE, "--http-port", "0", "--config", str(config)]
    async with await anyio.open_process(argv, env=clean_env(tmp_path)) as proc:
        try:
            await eventually(
                lambda: api.get("Node", NODE)["metadata"].get("labels", {}).get(KEYS.gpuhealth),
                30, "the agent's first verdict")
            proc.send_signal(signal.SIGTERM)
            with anyio.fail_after(10):
                code = await proc.wait()
        finally:
            if proc.returncode is None:
                proc.kill()
        assert proc.stderr is not None
        logs = (await proc.stderr.receive()).decode()
    assert code == 0
    first = json.loads(logs.splitlines()[0])
    assert first["node"] == NODE and first["level"] == "INFO"
    assert api.get("Node", NODE)["metadata"]["labels"][KEYS.gpuhealth] == "PASS"


@pytest.mark.parametrize(("config", "sim", "named"), [
    ("agent: {recover_after: 0}\n", "healthy-8xh100", "agent.recover_after"),
    ("agent: {diagnostics: [{check: 'dcgm:3'}]}\n", "healthy-8xh100", "interval or cron"),
    ("checks: {nope: {}}\n", "healthy-8xh100", "checks.nope"),
    ("{}\n", "no-such-machine", "no-such-machine"),
    ("{}\n", "healthy-8xh100", "no usable Kubernetes configuration"),
])
def test_bad_startup_exits_78_naming_the_problem(tmp_path: Path, config: str, sim: str,
                                                 named: str) -> None:
    path = tmp_path / "healthd.yaml"
    path.write_text(config)
    proc = subprocess.run([*HEALTHD, "agent", "--config", str(path), "--sim", sim,
                           "--node", NODE], env=clean_env(tmp_path), capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 78, proc.stderr
    assert named in proc.stderr
