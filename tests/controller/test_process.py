"""`healthd controller` as a process: it leads over a kubeconfig, resets an AppWrapper
on an EVICT node, serves its metrics, stops within 10 s of SIGTERM with exit 0 and
hands the Lease over on the way out; a config it cannot use exits 78 naming the
field."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import anyio
import pytest

from healthd.cli import main
from healthd.sim.apiserver import ApiEmulator
from tests.controller.conftest import (
    appwrapper,
    default_flavor,
    eventually,
    gpu_pod,
    node,
    phase,
    set_verdict,
    slack_queue,
)

HEALTHD = [sys.executable, "-m", "healthd.cli"]
CONFIG = """\
controller:
  election: {lease_duration: 2s, renew_deadline: 1s, retry_period: 200ms}
  breaker: {max_unhealthy: 50%}
"""


def clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "POD_NAME")}
    env["HOME"] = str(tmp_path)  # no ~/.kube/config to fall back on
    return env | extra


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def scrape_until(port: int, *lines: str, within: float = 3) -> None:
    """Scrape /metrics until it shows every line; fails the test after `within`."""
    text = ""
    with anyio.move_on_after(within):
        async with aiohttp.ClientSession() as session:
            while not all(line in text for line in lines):
                async with session.get(f"http://127.0.0.1:{port}/metrics") as resp:
                    text = await resp.text()
                await anyio.sleep(0.05)
    assert all(line in text for line in lines), text


@pytest.mark.anyio
async def test_the_controller_process_resets_serves_metrics_and_stops_on_sigterm(
        api: ApiEmulator, tmp_path: Path) -> None:
    api.seed(node("n1"), node("n2"), appwrapper("a"), gpu_pod("a", "n1"), default_flavor(),
             slack_queue())
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    (tmp_path / "healthd.yaml").write_text(CONFIG)
    port = free_port()
    argv = [*HEALTHD, "controller", "--kubeconfig", str(kubeconfig), "--http-port", str(port),
            "--config", str(tmp_path / "healthd.yaml")]
    lease = ("Lease", "healthd-controller", "healthd-system")
    async with await anyio.open_process(argv, env=clean_env(tmp_path, POD_NAME="ctl-0")) as proc:
        try:
            await eventually(lambda: (api.get(*lease) or {}).get("spec", {})
                             .get("holderIdentity") == "ctl-0", within=30)
            await anyio.sleep(0.5)  # the caches sync
            set_verdict(api, "n1", "EVICT")
            await eventually(lambda: phase(api, "a") == "Resetting", within=5)
            await scrape_until(port, 'healthd_controller_resets_total{result="reset"} 1.0',
                               "healthd_controller_leader 1.0")
            proc.send_signal(signal.SIGTERM)
            with anyio.fail_after(10):
                code = await proc.wait()
        finally:
            if proc.returncode is None:
                proc.kill()
    assert code == 0
    assert (api.get(*lease) or {})["spec"]["holderIdentity"] == ""  # handed over


@pytest.mark.parametrize(("config", "named"), [
    ("controller: {breaker: {max_unhealthy: lots}}\n", "controller.breaker.max_unhealthy"),
    ("controller: {election: {lease_duration: 5s, renew_deadline: 10s}}\n", "renew_deadline"),
    ("controller: {slack_queues: ['']}\n", "controller.slack_queues"),
])
def test_a_config_it_cannot_use_exits_78_naming_the_field(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], config: str, named: str) -> None:
    path = tmp_path / "healthd.yaml"
    path.write_text(config)
    assert main(["controller", "--config", str(path)]) == 78
    assert named in capsys.readouterr().err


def test_no_cluster_to_talk_to_exits_78(tmp_path: Path) -> None:
    proc = subprocess.run([*HEALTHD, "controller"], env=clean_env(tmp_path),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 78, proc.stderr
    assert "no usable Kubernetes configuration" in proc.stderr
