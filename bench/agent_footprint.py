"""agent_footprint: the memory and CPU a running `healthd agent` costs its node.

Starts the API emulator (on a thread of this process), then the real agent as a
subprocess, `healthd agent --sim healthy-8xh100`, with the default config (default
schedule: the NVML round every 30 s, pciebw and pvc hourly, ping every 5 min), and
samples `/proc/<pid>/status` (VmRSS, VmHWM) and `/proc/<pid>/stat` (utime + stime,
plus reaped children) for N minutes after its first verdict reached the Node.

Goals: peak RSS <= 60 MiB; CPU <= 0.5 % of one core in steady state (from the first
verdict on; start-up, which imports the libraries and runs the first full round, is
reported apart).

    python bench/agent_footprint.py            # 10 minutes
    python bench/agent_footprint.py --quick    # 1 minute
    python bench/agent_footprint.py --minutes 0.2 --config healthd.yaml
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import Goal, main, parser

from healthd.kube.conventions import Keys
from healthd.sim.apiserver import ApiEmulator, ThreadedEmulator

NAME = "agent_footprint"
NODE = "bench-node"
SPEC = "healthy-8xh100"
RSS_GOAL_MIB = 60.0
CPU_GOAL_PCT = 0.5
SAMPLE_S = 5.0
READY_WAIT_S = 120.0
TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Sample:
    at: float  # monotonic seconds
    rss_kib: int
    hwm_kib: int
    cpu_s: float  # the process's own user + system time
    children_cpu_s: float  # reaped children's (checks' subprocesses)


def read_sample(pid: int) -> Sample:
    """One reading of the process's memory and CPU from /proc."""
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    # /proc/<pid>/stat: the command may hold spaces; fields resume after its ')'.
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    utime, stime, cutime, cstime = (int(v) for v in stat[11:15])
    return Sample(time.monotonic(), _kib(fields["VmRSS"]), _kib(fields["VmHWM"]),
                  (utime + stime) / TICKS, (cutime + cstime) / TICKS)


def _kib(value: str) -> int:
    return int(value.split()[0])


def agent_command(kubeconfig: Path, config: str | None, spec: str | None = SPEC) -> list[str]:
    """The agent on simulated `spec`, or on this machine's real GPUs when None."""
    extra = ["--config", str(Path(config).resolve())] if config else []
    sim = ["--sim", spec] if spec else []
    return [sys.executable, "-m", "healthd.cli", "agent", *sim,
            "--kubeconfig", str(kubeconfig), "--node", NODE, "--http-port", "0",
            "--log-level", "WARNING", *extra]


def wait_first_verdict(api: ThreadedEmulator, proc: subprocess.Popen[bytes]) -> float:
    """Seconds until the agent's first verdict is on the Node (RuntimeError if never)."""
    start, key = time.monotonic(), Keys().gpuhealth
    while time.monotonic() - start < READY_WAIT_S:
        if proc.poll() is not None:
            raise RuntimeError(f"the agent exited with {proc.returncode} before its verdict")
        node = api.get("Node", NODE) or {}
        if (node.get("metadata") or {}).get("labels", {}).get(key):
            return time.monotonic() - start
        time.sleep(0.05)
    raise RuntimeError(f"no verdict on the Node within {READY_WAIT_S:g} s")


def sample_for(pid: int, seconds: float) -> list[Sample]:
    samples = [read_sample(pid)]
    end = samples[0].at + seconds
    while (now := time.monotonic()) < end:
        time.sleep(min(SAMPLE_S, end - now))
        samples.append(read_sample(pid))
    return samples


def stop(proc: subprocess.Popen[bytes]) -> int | None:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None


def measure(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Goal], list[str]]:
    minutes = args.minutes if args.minutes is not None else (1.0 if args.quick else 10.0)
    figures, goals = footprint(minutes, args.config)
    return figures, goals, [
        f"{SPEC}, {args.config or 'default config and schedule'}, {minutes:g} min sampled "
        f"every {SAMPLE_S:g} s after the first verdict",
        "CPU includes every thread of the agent; children_cpu_s counts reaped subprocesses",
    ]


def footprint(minutes: float, config: str | None, spec: str | None = SPEC,
              gpus: int = 8) -> tuple[dict[str, Any], dict[str, Goal]]:
    """Run the agent (on simulated `spec`, or the real GPUs when None) against the API
    emulator and sample it for `minutes` after its first verdict."""
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "NODE_NAME")}
    with tempfile.TemporaryDirectory() as tmp, ApiEmulator.in_thread() as api:
        api.seed({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE},
                  "status": {"capacity": {"nvidia.com/gpu": str(gpus)}}})
        kubeconfig = api.write_kubeconfig(Path(tmp) / "kubeconfig")
        launched = time.monotonic()
        proc = subprocess.Popen(agent_command(kubeconfig, config, spec), env=env, cwd=tmp,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            to_verdict = wait_first_verdict(api, proc)
            samples = sample_for(proc.pid, minutes * 60)
        finally:
            code = stop(proc)
        writes = len(api.writes())
        statuses = published_statuses(api)
    figures = {**figures_of(samples, launched, to_verdict, code, writes),
               "check_statuses": statuses}
    return figures, goals_of(samples)


def published_statuses(api: ThreadedEmulator) -> dict[str, str]:
    """Each check's status as the agent published it on the Node (`pciebw`: PASS when
    it measured and judged)."""
    annotations = ((api.get("Node", NODE) or {}).get("metadata") or {}).get("annotations") or {}
    try:
        checks = json.loads(annotations.get(Keys().health, "{}")).get("checks") or {}
    except ValueError:
        return {}
    return {name: str(entry.get("status")) for name, entry in checks.items()}


def steady_cpu_pct(samples: list[Sample]) -> float:
    first, last = samples[0], samples[-1]
    used = (last.cpu_s + last.children_cpu_s) - (first.cpu_s + first.children_cpu_s)
    return 100 * used / max(last.at - first.at, 1e-9)


def figures_of(samples: list[Sample], launched: float, to_verdict: float, code: int | None,
               writes: int) -> dict[str, Any]:
    first, last = samples[0], samples[-1]
    return {
        "sampled_s": round(last.at - first.at, 1),
        "startup_to_first_verdict_s": round(to_verdict, 3),
        "startup_cpu_s": round(first.cpu_s + first.children_cpu_s, 3),
        "rss_mib_at_first_verdict": round(first.rss_kib / 1024, 1),
        "rss_mib_last": round(last.rss_kib / 1024, 1),
        "rss_mib_peak": round(last.hwm_kib / 1024, 1),
        "cpu_pct_of_core_steady": round(steady_cpu_pct(samples), 4),
        "cpu_pct_of_core_overall": round(
            100 * (last.cpu_s + last.children_cpu_s) / max(last.at - launched, 1e-9), 4),
        "children_cpu_s": round(last.children_cpu_s, 3),
        "api_writes_total": writes,
        "exit_code_after_sigterm": code,
        "rss_mib_timeline": [round(s.rss_kib / 1024, 1) for s in samples[:: max(1, len(samples)
                                                                            // 20)]],
    }


def goals_of(samples: list[Sample]) -> dict[str, Goal]:
    return {
        "rss_mib_peak": Goal(samples[-1].hwm_kib / 1024, RSS_GOAL_MIB),
        "cpu_pct_of_core_steady": Goal(steady_cpu_pct(samples), CPU_GOAL_PCT),
    }


if __name__ == "__main__":
    cli = parser(__doc__.splitlines()[0])
    cli.add_argument("--minutes", type=float, help="sampling time (default 10, --quick 1)")
    cli.add_argument("--config", help="an agent config file (default: none, the defaults)")
    sys.exit(main(NAME, measure, cli.parse_args()))
