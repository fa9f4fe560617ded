"""memory_soak: does the agents' and the controller's memory reach a plateau under churn?

Starts the API emulator (on a thread of this process), N real agents
(`healthd agent --sim SPEC`, one subprocess per node, the NVML checks every 5 s) and the
real controller as a subprocess, on the `label_to_reset` cluster (AppWrappers with GPU
pods on every node, the slack ClusterQueue). Then churns for the whole run:

- faults from each node's machine spec, in windows that repeat: XID 79 (sticky EVICT,
  so the controller resets the node's AppWrappers), a pending row remap (ERR) and a
  hardware slowdown (WARN) that come and go;
- on-demand requests (`healthd.io/run`) and clears (`healthd.io/clear`) written on the
  Nodes, one node after the other;
- AppWrappers the controller reset are put back to `Running`, so the next fault
  resets them again.

Every SAMPLE_S it reads each process's VmRSS from /proc. Figures per process: RSS at
the start and end, the least-squares slope in KiB/min over the whole run and over the
last 30 minutes (or the last half of a shorter run), and whether that is a plateau
(|slope| <= PLATEAU_KIB_PER_MIN). `--tracemalloc` runs agent 0 and the controller
under tracemalloc and reports, for each, the Python allocations that grew between the
first snapshot after warm-up and the last: in all, and the sites that grew most (what
to look at when something creeps).

    nice -n 19 python bench/memory_soak.py --agents 5 --minutes 60
    nice -n 19 python bench/memory_soak.py --agents 6 --minutes 60 --malloc-arena-max 2
    python bench/memory_soak.py --quick                  # 2 agents, 1 minute
    python bench/memory_soak.py --agents 1 --minutes 15 --tracemalloc
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from agent_footprint import read_sample, stop
from common import Goal, main, parser
from reset_cluster import cluster

from healthd.kube.conventions import Keys
from healthd.sim.apiserver import ApiEmulator, ThreadedEmulator

NAME = "memory_soak"
KEYS = Keys()
SAMPLE_S = 15.0
CHURN_S = 5.0  # one churn action this often
CYCLE_S = 240.0  # the fault windows repeat this often
PLATEAU_KIB_PER_MIN = 5.0
TAIL_MIN = 30.0
SNAPSHOTS = 8  # tracemalloc snapshots of agent 0 and the controller over the run

# A daemon under tracemalloc: dumps a snapshot to DIR every PERIOD s, runs as usual.
TRACED = """
import sys, threading, time, tracemalloc
from healthd.cli import main
folder, period = sys.argv[1], float(sys.argv[2])
def dump():
    i = 0
    while True:
        time.sleep(period)
        tracemalloc.take_snapshot().dump(f"{folder}/snap-{i:03d}.bin")
        i += 1
threading.Thread(target=dump, daemon=True).start()
sys.exit(main(sys.argv[3:]))
"""


def node_name(i: int) -> str:
    return f"node-{i:05d}"


def machine_spec(i: int, minutes: float) -> dict[str, Any]:
    """Node i's machine: every CYCLE_S an XID 79, a pending remap and a slowdown, each
    on a GPU that moves round the node, for the whole run (plus a margin)."""
    faults: list[dict[str, Any]] = []
    cycles = int(minutes * 60 / CYCLE_S) + 2
    for c in range(cycles):
        start, gpu = c * CYCLE_S + 5 * i, (c + i) % 8
        faults.append({"gpu": gpu, "xid": [{"code": 79, "at": start + 10}]})
        faults.append({"gpu": (gpu + 1) % 8, "at": start + 40, "until": start + 100,
                       "remapped_rows": {"uncorrectable": 1, "pending": True}})
        faults.append({"gpu": (gpu + 2) % 8, "at": start + 20, "until": start + 140,
                       "clock_event_reasons": ["hw_slowdown"]})
    return {"node": node_name(i), "gpus": {"count": 8}, "faults": faults}


AGENT_CONFIG = {"checks": {name: {"interval": "5s"} for name in
                           ("remapped", "power", "pcie", "ecc", "xid", "nvlink", "gpus")}}


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    rss: list[tuple[float, int]] = field(default_factory=list)  # (monotonic s, KiB)


def launch(tmp: Path, kubeconfig: Path, agents: int, minutes: float,
           traced: Path | None, arena_max: int | None) -> list[Proc]:
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "NODE_NAME")}
    env["POD_NAME"] = "soak-controller"
    config = tmp / "healthd.yaml"
    config.write_text(yaml.safe_dump(AGENT_CONFIG))
    period = max(minutes * 60 / SNAPSHOTS, 5.0)

    def command(args: list[str], trace_to: Path | None) -> list[str]:
        if trace_to is None:
            return [sys.executable, "-m", "healthd.cli", *args]
        trace_to.mkdir(exist_ok=True)
        return [sys.executable, "-X", "tracemalloc=12", "-c", TRACED, str(trace_to),
                str(period), *args]

    ctl = ["controller", "--kubeconfig", str(kubeconfig), "--config", str(config),
           "--http-port", "0", "--log-level", "WARNING"]
    procs = [Proc("controller", subprocess.Popen(
        command(ctl, traced / "controller" if traced else None),
        env=env, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))]
    for i in range(agents):
        spec = tmp / f"machine-{i}.yaml"
        spec.write_text(yaml.safe_dump(machine_spec(i, minutes)))
        args = ["agent", "--sim", str(spec), "--kubeconfig", str(kubeconfig), "--node",
                node_name(i), "--http-port", "0", "--log-level", "WARNING",
                "--config", str(config)]
        trace_to = traced / "agent-0" if traced is not None and i == 0 else None
        own_env, name = env, f"agent-{i}"
        if arena_max is not None and i % 2:  # an A/B of glibc's malloc arenas
            own_env, name = {**env, "MALLOC_ARENA_MAX": str(arena_max)}, f"{name}-arenas"
        procs.append(Proc(name, subprocess.Popen(
            command(args, trace_to), env=own_env, cwd=tmp, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)))
    return procs


class Churn:
    """One action per call, round the nodes: request, clear, put AppWrappers back."""

    def __init__(self, api: ThreadedEmulator, agents: int) -> None:
        self.api, self.agents, self.step = api, agents, 0
        self.counts = {"requests": 0, "clears": 0, "appwrappers_restored": 0}

    def __call__(self) -> None:
        i, action = self.step % self.agents, (self.step // self.agents) % 3
        self.step += 1
        if action == 0:
            self._annotate(i, KEYS.run, "all" if self.step % 2 else "remapped,ecc")
            self.counts["requests"] += 1
        elif action == 1:
            self._annotate(i, KEYS.clear, "true")
            self.counts["clears"] += 1
        else:
            self._restore_appwrappers()

    def _annotate(self, i: int, key: str, value: str) -> None:
        node = self.api.get("Node", node_name(i))
        if node is not None:
            node["metadata"].setdefault("annotations", {})[key] = value
            self.api.put(node)

    def _restore_appwrappers(self) -> None:
        for aw in self.api.list("AppWrapper"):
            if (aw.get("status") or {}).get("phase") != "Running":
                aw["status"]["phase"] = "Running"
                aw["status"]["conditions"] = [c for c in aw["status"].get("conditions", [])
                                              if c.get("type") == "QuotaReserved"]
                self.api.put(aw)
                self.counts["appwrappers_restored"] += 1


def soak(agents: int, minutes: float, traced: bool,
         arena_max: int | None = None) -> tuple[dict[str, Any], dict[str, Goal]]:
    with tempfile.TemporaryDirectory() as tmp_name, ApiEmulator.in_thread() as api:
        tmp = Path(tmp_name)
        api.seed(*cluster(agents))
        kubeconfig = api.write_kubeconfig(tmp / "kubeconfig")
        snaps = tmp / "snapshots"
        snaps.mkdir()
        procs = launch(tmp, kubeconfig, agents, minutes, snaps if traced else None, arena_max)
        churn = Churn(api, agents)
        try:
            run(procs, churn, minutes * 60, SAMPLE_S if minutes >= 5 else 2.0)
        finally:
            codes = {p.name: stop(p.popen) for p in procs}
        figures = figures_of(procs, codes, churn, minutes)
        figures["resets_written"] = len(api.writes("PATCH", r".*/appwrappers/[^/]+/status"))
        figures["node_writes"] = len(api.writes(None, r"/api/v1/nodes/.*"))
        if traced:
            figures["agent_0_tracemalloc_growth"] = growth(snaps / "agent-0")
            figures["controller_tracemalloc_growth"] = growth(snaps / "controller")
    return figures, goals_of(procs, minutes)


def run(procs: list[Proc], churn: Churn, seconds: float, sample_s: float) -> None:
    start = time.monotonic()
    next_sample = next_churn = start
    while (now := time.monotonic()) - start < seconds:
        for p in procs:
            if p.popen.poll() is not None:
                raise RuntimeError(f"{p.name} exited with {p.popen.returncode}")
        if now >= next_sample:
            for p in procs:
                p.rss.append((now, read_sample(p.popen.pid).rss_kib))
            next_sample += sample_s
        if now >= next_churn:
            churn()
            next_churn += CHURN_S
        time.sleep(max(0.0, min(next_sample, next_churn) - time.monotonic()))


def slope_kib_per_min(points: list[tuple[float, int]]) -> float | None:
    """Least-squares slope of RSS over time."""
    if len(points) < 3:
        return None
    return statistics.linear_regression([t / 60 for t, _ in points],
                                        [float(kib) for _, kib in points]).slope


def tail(points: list[tuple[float, int]], minutes: float) -> list[tuple[float, int]]:
    """The last TAIL_MIN minutes, or the last half of a shorter run."""
    keep = TAIL_MIN if minutes >= 2 * TAIL_MIN else minutes / 2
    end = points[-1][0] if points else 0.0
    return [p for p in points if p[0] >= end - keep * 60]


def figures_of(procs: list[Proc], codes: dict[str, int | None], churn: Churn,
               minutes: float) -> dict[str, Any]:
    per: dict[str, Any] = {}
    for p in procs:
        if not p.rss:
            continue
        late = slope_kib_per_min(tail(p.rss, minutes))
        per[p.name] = {
            "rss_kib_start": p.rss[0][1], "rss_kib_end": p.rss[-1][1],
            "rss_kib_peak": max(k for _, k in p.rss),
            "slope_kib_per_min_all": _r(slope_kib_per_min(p.rss)),
            "slope_kib_per_min_tail": _r(late),
            "plateau": late is not None and abs(late) <= PLATEAU_KIB_PER_MIN,
            "exit_code_after_sigterm": codes.get(p.name),
        }
    agent_tails = [v["slope_kib_per_min_tail"] for k, v in per.items()
                   if k.startswith("agent") and v["slope_kib_per_min_tail"] is not None]
    return {"minutes": minutes, "tail_minutes": min(TAIL_MIN, minutes / 2) if minutes
            < 2 * TAIL_MIN else TAIL_MIN, "processes": per, "churn": churn.counts,
            "agent_slope_tail_median": _r(statistics.median(agent_tails)) if agent_tails
            else None, "agent_slope_tail_max": max(agent_tails, default=None)}


def goals_of(procs: list[Proc], minutes: float) -> dict[str, Goal]:
    out = {}
    for p in procs:
        late = slope_kib_per_min(tail(p.rss, minutes))
        out[f"{p.name}_slope_kib_per_min_tail"] = Goal(late, PLATEAU_KIB_PER_MIN)
    return out


def growth(folder: Path, top: int = 12) -> list[dict[str, Any]]:
    """The allocation sites that grew most between the second snapshot (after warm-up)
    and the last one."""
    files = sorted(folder.glob("snap-*.bin"))
    if len(files) < 3:
        return []
    first = tracemalloc.Snapshot.load(str(files[1]))
    last = tracemalloc.Snapshot.load(str(files[-1]))
    stats = last.compare_to(first, "traceback")
    total = {"kib": round(sum(s.size_diff for s in stats) / 1024, 1),
             "count": sum(s.count_diff for s in stats),
             "where": ["(all Python allocations together)"]}
    return [total, *({"kib": round(s.size_diff / 1024, 1), "count": s.count_diff,
                      "where": [f"{f.filename.split('site-packages/')[-1]}:{f.lineno}"
                                for f in s.traceback[-6:]]} for s in stats[:top])]


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def measure(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Goal], list[str]]:
    minutes = args.minutes if args.minutes is not None else (1.0 if args.quick else 60.0)
    agents = args.agents if args.agents is not None else (2 if args.quick else 5)
    figures, goals = soak(agents, minutes, args.tracemalloc, args.malloc_arena_max)
    return figures, goals, [
        f"{agents} agents (NVML checks every 5 s) + the controller, {minutes:g} min, RSS "
        f"every {SAMPLE_S:g} s (2 s under 5 min); churn: one request/clear/AppWrapper "
        f"restore every {CHURN_S:g} s, XID 79 + pending remap + slowdown per node every "
        f"{CYCLE_S:g} s",
        f"plateau: |slope over the last {TAIL_MIN:g} min (or last half)| <= "
        f"{PLATEAU_KIB_PER_MIN:g} KiB/min",
    ]


if __name__ == "__main__":
    cli = parser(__doc__.splitlines()[0])
    cli.add_argument("--minutes", type=float, help="run time (default 60, --quick 1)")
    cli.add_argument("--agents", type=int, help="agents (default 5, --quick 2)")
    cli.add_argument("--tracemalloc", action="store_true",
                     help="trace agent 0's allocations and report what grew")
    cli.add_argument("--malloc-arena-max", type=int, metavar="N",
                     help="run the odd-numbered agents with MALLOC_ARENA_MAX=N (named "
                     "agent-K-arenas), to compare glibc's allocator arenas")
    sys.exit(main(NAME, measure, cli.parse_args()))
