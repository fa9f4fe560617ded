"""real_gpu: the acceptance run on a machine with NVIDIA GPUs, in one command.

1. one NVML pass through the checks' reader: every reading of every GPU accounted
   for (Ok, or the NVML error it got), with the driver and CUDA versions, and each
   GPU's NVLink fabric state; then the kernel log as the agent reads it (readable or
   why not, XID and SXID lines by code, XID lines whose PCI address no GPU has);
2. the `gpu`-marked tests (`pytest -m gpu`);
3. `healthd record` (with the pciebw probe, and a dcgmi level-1 report when dcgmi is
   installed), then `healthd check` on the machine and `healthd check --sim` on the
   recording: per check and entity, statuses and finding codes must match; values
   that moved between the two runs (power draw, bandwidth) are listed;
4. the NVML round through the agent's runner (bench/nvml_round.py), goal <= 50 ms
   for 8 GPUs;
5. the PCIe bandwidth `healthd check` measured per GPU, next to the link's
   theoretical rate and the ratio; what the check's child costs per measurement
   (bench/pciebw_child.py: start to exit, its peak RSS);
6. `healthd check --checks pciebw` beside a busy job on GPU 0 (bench/gpu_load.py,
   `h2d`, `compute` and `both`, when PyTorch is there): what the check said, which
   must be no finding (GPU 0 SKIPPED "busy");
7. `healthd agent` on the real NVML against the API emulator for a few minutes
   (bench/agent_footprint.py): RSS (steady and peak, with pciebw measured at start,
   its copies in a child) and CPU.

Without a GPU (no driver, or NVML sees none) it says so on stderr, prints one JSON
object whose figures hold `skipped`, and exits 0. `--sim SPEC` runs the same steps
on a simulated machine instead (a rehearsal of the script itself, no GPU needed; the
busy job is a `busy` fault on GPU 0, as the load shows NVML).

    python bench/real_gpu.py            # agent sampled 3 minutes, 300 NVML rounds
    python bench/real_gpu.py --quick    # 0.5 minute, 30 rounds
    python bench/real_gpu.py --quick --sim h100-vm-notsupported
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import yaml
from agent_footprint import footprint
from common import REPO, Goal, main, parser
from nvml_round import GOAL_MS, real, round_config, simulated
from pciebw_child import costs

from checks.kernel_log import KernelLog, LogUnavailable, pci_key
from checks.nvml_reader import NvmlReader
from checks.pciebw import MIB, PcieBwParams
from checks.pciebw_probe import cuda_child_command
from checks.probes import LoggedSxid, LoggedXid
from checks.snapshot import NodeSnapshot, Ok, Unsupported

NAME = "real_gpu"
RECORDED_CHECKS = "gpus,remapped,recovery,power,pcie,aer,ecc,nvlink,fabric,xid,sxid,rdma,pciebw"
PCIE_MIN_RATIO = 0.7  # the pciebw check's default min_fraction
PROPERTIES = ("mig_mode", "remapped", "clock_event_reasons", "power", "pcie", "pcie_replays",
              "ecc", "retired_pages_pending", "nvlinks", "fabric", "recovery_action")
TIMES = {"last_judged"}  # values that are a time: they move between any two runs
LOADS = ("h2d", "compute", "both")  # bench/gpu_load.py's modes
LOAD_S = 120  # the load ends itself; pciebw on every GPU ends well before
# What each load shows NVML, for the rehearsal on a simulated machine: its process and,
# when it copies, the host-to-device traffic the H200 showed beside the probe.
SIM_LOADS: dict[str, dict[str, Any]] = {
    "h2d": {"processes": 1, "pcie_rx_gbps": 24.8},
    "compute": {"processes": 1},
    "both": {"processes": 1, "pcie_rx_gbps": 24.8},
}
# One look per GPU: a busy GPU is SKIPPED at once rather than tried again 30 s later.
NO_RETRY = "checks: {pciebw: {params: {busy_retries: 0}}}\n"


def inventory(sim: str | None) -> NodeSnapshot:
    """One pass of the checks' reader, on the real NVML (or the simulated `sim`)."""
    with ExitStack() as stack:
        if sim:
            from healthd.sim.fakenvml import install
            from healthd.sim.machine import load_machine_spec

            stack.enter_context(install(load_machine_spec(sim)))
        reader = NvmlReader()
        try:
            return reader.read()
        finally:
            reader.close()


def accounted(snapshot: NodeSnapshot) -> dict[str, dict[str, int]]:
    """Per property, how many GPUs read Ok and how many got which NVML error."""
    out: dict[str, dict[str, int]] = {}
    for name in PROPERTIES:
        outcomes: Counter[str] = Counter()
        for gpu in snapshot.gpus:
            reading = getattr(gpu, name)
            if gpu.lost:
                outcomes["GPU_IS_LOST"] += 1
            elif isinstance(reading, Ok):
                outcomes["ok"] += 1
            else:
                kind = "unsupported" if isinstance(reading, Unsupported) else "failed"
                outcomes[f"{kind}:{reading.function or '?'}:{reading.error or reading.reason}"] += 1
        out[name] = dict(outcomes)
    return out


def fabric_states(snapshot: NodeSnapshot) -> dict[str, int]:
    """How many GPUs are in which fabric state/status (`completed/SUCCESS`), or have
    no fabric (`none`)."""
    states: Counter[str] = Counter()
    for gpu in snapshot.gpus:
        fabric = gpu.fabric
        states[f"{fabric.value.state}/{fabric.value.status}" if isinstance(fabric, Ok)
               else "none"] += 1
    return dict(states)


def kernel_log(snapshot: NodeSnapshot, sim: str | None) -> dict[str, Any]:
    """The kernel log as the agent reads it: XID and SXID lines since boot by code,
    and XID lines whose PCI address matches no GPU NVML lists."""
    with tempfile.TemporaryDirectory() as tmp:
        source = KernelLog() if sim is None else _simulated_log(Path(tmp), sim)
        started = time.perf_counter()
        try:
            logged = [*source.take("xid"), *source.take("sxid")]
        except LogUnavailable as exc:
            return {"readable": False, "reason": str(exc)}
        finally:
            source.close()
        read_ms = (time.perf_counter() - started) * 1000
    known = {pci_key(gpu.pci_bus_id) for gpu in snapshot.gpus}
    xids = [line for line in logged if isinstance(line, LoggedXid)]
    return {"readable": True, "read_ms": round(read_ms, 3),
            "xid_lines": dict(Counter(str(line.xid) for line in xids)),
            "sxid_lines": dict(Counter(str(line.sxid) for line in logged
                                       if isinstance(line, LoggedSxid))),
            "xid_pci_unmatched": sorted({line.pci for line in xids if line.pci not in known})}


def _simulated_log(workdir: Path, sim: str) -> KernelLog:
    from healthd.sim.kernellog import SimKernelLog
    from healthd.sim.machine import load_machine_spec

    spec = load_machine_spec(sim)
    log = SimKernelLog(workdir / "kmsg", lambda: spec.uptime_s)
    log.write_history(spec.kernel_log or [])
    return KernelLog(log.path)


def healthd(*args: str, timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "healthd.cli", *args], capture_output=True,
                          text=True, timeout=timeout_s, cwd=REPO, check=False)


def gpu_tests() -> dict[str, Any]:
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p",
                           "no:cacheprovider", "tests"], capture_output=True, text=True,
                          timeout=1800, cwd=REPO, check=False)
    counts = {word: int(n) for n, word in
              re.findall(r"(\d+) (passed|failed|skipped|error|errors)", proc.stdout)}
    return {"exit_code": proc.returncode, "seconds": round(time.monotonic() - started, 1),
            "passed": counts.get("passed", 0), "failed": counts.get("failed", 0),
            "skipped": counts.get("skipped", 0),
            "errors": counts.get("error", 0) + counts.get("errors", 0),
            "tail": proc.stdout.strip().splitlines()[-15:] if proc.returncode else []}


def record_and_replay(workdir: Path, sim: str | None) -> dict[str, Any]:
    """Record, check the machine, replay the recording; compare what a user sees."""
    recording = workdir / "recorded.yaml"
    machine_sim = ["--sim", sim] if sim else []
    checks = RECORDED_CHECKS + (",dcgm" if shutil.which("dcgmi") else "")
    includes = ["--include", "pciebw", "--include", "xid-window=1s"]
    if shutil.which("dcgmi"):
        includes += ["--include", "dcgm"]
    started = time.monotonic()
    rec = healthd("record", "--output", str(recording), *includes, *machine_sim)
    recorded_s = time.monotonic() - started
    if rec.returncode != 0:
        return {"record_exit_code": rec.returncode, "error": rec.stderr.strip()[-2000:]}
    machine = json.loads(healthd("check", "--checks", checks, "--output", "json",
                                 *machine_sim).stdout)
    replay = json.loads(healthd("check", "--checks", checks, "--sim", str(recording),
                                "--output", "json").stdout)
    return {"record_exit_code": 0, "record_s": round(recorded_s, 2), "checks": checks,
            "recording_bytes": recording.stat().st_size, **compare(machine, replay),
            "machine_report": machine}


def outcomes(report: dict[str, Any]) -> dict[str, tuple[str, tuple[str, ...], dict[str, Any]]]:
    """(check, entity) -> (status, finding codes, values)."""
    out: dict[str, tuple[str, tuple[str, ...], dict[str, Any]]] = {}
    for check in report["checks"]:
        codes: dict[str, list[str]] = {}
        for finding in check.get("findings", []):
            codes.setdefault(_entity(finding["entity"]), []).append(finding["code"])
        for row in check.get("entities", []):
            key = f"{check['check']}/{_entity(row['entity'])}"
            out[key] = (row["status"], tuple(sorted(codes.get(_entity(row["entity"]), []))),
                        row.get("values", {}))
        out[check["check"]] = (check["status"], (), {})
    return out


def _entity(entity: dict[str, Any]) -> str:
    return f"{entity.get('kind')}:{entity.get('name')}"


def compare(machine: dict[str, Any], replay: dict[str, Any]) -> dict[str, Any]:
    seen, replayed = outcomes(machine), outcomes(replay)
    mismatches = [key for key in sorted(set(seen) | set(replayed))
                  if key not in seen or key not in replayed or seen[key][:2] != replayed[key][:2]]
    moved = [f"{key}.{name}: {value} -> {replayed[key][2].get(name)}"
             for key in sorted(set(seen) & set(replayed))
             for name, value in seen[key][2].items()
             if name not in TIMES and replayed[key][2].get(name) != value]
    return {"rows_compared": len(seen), "status_or_code_mismatches": mismatches,
            "values_moved": moved[:40], "values_moved_count": len(moved)}


def pcie_bandwidth(machine_report: dict[str, Any]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for check in machine_report.get("checks", []):
        if check["check"] != "pciebw":
            continue
        for row in check.get("entities", []):
            values = row.get("values", {})
            link = values.get("link_gbps")
            measured = [values[k] for k in ("h2d_gbps", "d2h_gbps") if k in values]
            rows.append({"gpu": row["entity"].get("name"), "status": row["status"],
                         "link": f"Gen{values.get('link_gen')} x{values.get('link_width')}",
                         "h2d_gbps": values.get("h2d_gbps"), "d2h_gbps": values.get("d2h_gbps"),
                         "link_gbps": link, "max_link_gbps": values.get("max_link_gbps"),
                         "ratio": round(min(measured) / link, 3) if link and measured else None})
    return rows


def child_costs(snapshot: NodeSnapshot, runs: int) -> dict[str, Any]:
    """What the pciebw child costs measuring GPU 0 (without CUDA: its interpreter)."""
    size = PcieBwParams().size_mib * MIB
    return {"size_mib": size // MIB,
            **costs(cuda_child_command(snapshot.gpus[0].pci_bus_id, size, 5), runs)}


def busy_runs(workdir: Path, sim: str | None) -> dict[str, Any]:
    """`healthd check --checks pciebw` beside each load on GPU 0: what the check said."""
    if sim is None and importlib.util.find_spec("torch") is None:
        return {"skipped": "PyTorch is not installed: no load to run beside pciebw"}
    config = workdir / "no-retry.yaml"
    config.write_text(NO_RETRY)
    said: dict[str, Any] = {}
    for mode in LOADS:
        if sim is not None:
            machine = ["--sim", str(busy_machine(workdir, sim, mode))]
            report = pciebw_report(machine, config)
        else:
            with gpu_load(mode):
                report = pciebw_report([], config)
        said[mode] = what_pciebw_said(report)
    return said


def busy_machine(workdir: Path, sim: str, mode: str) -> Path:
    """The simulated machine `sim` with the load `mode` on GPU 0."""
    from healthd.sim.machine import load_machine_spec

    spec = load_machine_spec(sim).model_dump(mode="json", exclude_none=True)
    spec["faults"] = [*spec["faults"], {"gpu": 0, "busy": SIM_LOADS[mode]}]
    path = workdir / f"busy-{mode}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@contextmanager
def gpu_load(mode: str) -> Iterator[None]:
    """bench/gpu_load.py running `mode` on GPU 0, from when it says it started."""
    proc = subprocess.Popen([sys.executable, str(REPO / "bench" / "gpu_load.py"), mode,
                             str(LOAD_S)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        while not (line := proc.stdout.readline()).startswith("busy: started"):
            if not line:
                raise RuntimeError(f"gpu_load.py {mode} ended before it started "
                                   f"(exit {proc.wait()})")
        yield
    finally:
        proc.kill()
        proc.wait()


def pciebw_report(machine: list[str], config: Path) -> dict[str, Any]:
    proc = healthd("check", "--checks", "pciebw", "--config", str(config), "--output", "json",
                   *machine)
    return dict(json.loads(proc.stdout))


def what_pciebw_said(report: dict[str, Any]) -> dict[str, Any]:
    """The check's status, its findings, and GPU 0's row."""
    (check,) = [c for c in report["checks"] if c["check"] == "pciebw"]
    gpu0 = next((row for row in check["entities"] if row["entity"].get("name") == "0"), {})
    return {"status": check["status"], "codes": [f["code"] for f in check["findings"]],
            "gpu0_status": gpu0.get("status"), "gpu0_reason": gpu0.get("reason", ""),
            "gpu0_values": gpu0.get("values", {})}


def measure(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Goal], list[str]]:
    snapshot = inventory(args.sim)
    if snapshot.driver_error or not snapshot.gpus:
        why = snapshot.driver_error or "NVML sees no GPU"
        print(f"real_gpu: skipped: no NVIDIA GPU here ({why})", file=sys.stderr)
        return {"skipped": f"no NVIDIA GPU: {why}"}, {}, []
    figures: dict[str, Any] = {
        "gpus": len(snapshot.gpus), "model": snapshot.gpus[0].model,
        "driver_version": snapshot.driver_version, "nvml_version": snapshot.nvml_version,
        "cuda_driver_version": snapshot.cuda_driver_version,
        "first_pass_ms": round(snapshot.duration_s * 1000, 3),
        "nvml_readings": accounted(snapshot),
        "fabric": fabric_states(snapshot),
        "kernel_log": kernel_log(snapshot, args.sim),
    }
    figures["gpu_tests"] = gpu_tests()
    with tempfile.TemporaryDirectory() as tmp:
        replay = record_and_replay(Path(tmp), args.sim)
    machine_report = replay.pop("machine_report", {})
    figures["record_replay"] = replay
    figures["pciebw"] = pcie_bandwidth(machine_report)
    figures["pciebw_child"] = child_costs(snapshot, 3 if args.quick else 10)
    with tempfile.TemporaryDirectory() as tmp:
        figures["pciebw_busy"] = busy_runs(Path(tmp), args.sim)
    rounds = 30 if args.quick else 300
    figures["nvml_round"] = (simulated(round_config(), rounds) if args.sim
                             else real(round_config(), rounds))
    minutes = args.agent_minutes or (0.5 if args.quick else 3.0)
    agent, agent_goals = footprint(minutes, None, spec=args.sim, gpus=len(snapshot.gpus))
    figures["agent"] = agent
    figures["agent_memory"] = {"rss_mib_steady": agent["rss_mib_last"],
                               "rss_mib_peak": agent["rss_mib_peak"],
                               "pciebw": agent["check_statuses"].get("pciebw")}
    return figures, goals_of(figures, agent_goals), [
        "nvml_readings: per property, GPUs that read ok or the NVML function:error they got",
        "fabric: GPUs per NVLink fabric state/status ('none': not in a fabric); kernel_log: "
        "what /dev/kmsg holds for the xid and sxid checks, or why it cannot be read",
        "record_replay compares healthd check on the machine with healthd check --sim on its "
        "recording; values_moved lists readings that changed between the two runs",
        "agent: healthd agent on the real NVML, default schedule, against the API emulator; "
        "agent_memory: its last RSS sample (steady) and VmHWM (peak), and what pciebw, run "
        "at start, published (PASS: measured and judged; the copies ran in its child)",
        "pciebw_busy: healthd check --checks pciebw beside bench/gpu_load.py on GPU 0 "
        "(--sim: a busy fault on GPU 0); pciebw_child: bench/pciebw_child.py on GPU 0",
    ]


def goals_of(figures: dict[str, Any], agent_goals: dict[str, Goal]) -> dict[str, Goal]:
    goals = {"gpu_tests_failed": Goal(figures["gpu_tests"]["failed"]
                                      + figures["gpu_tests"]["errors"], 0)}
    mismatches = figures["record_replay"].get("status_or_code_mismatches")
    if mismatches is not None:
        goals["replay_mismatches"] = Goal(len(mismatches), 0)
    round_ms = figures["nvml_round"].get("round_ms")
    if round_ms:
        goals["nvml_round_p99_ms"] = Goal(round_ms["p99"], GOAL_MS)
    ratios = [row["ratio"] for row in figures["pciebw"] if row["ratio"] is not None]
    if ratios:
        goals["pciebw_min_ratio"] = Goal(min(ratios), PCIE_MIN_RATIO, ">=")
    busy = figures["pciebw_busy"]
    if "skipped" not in busy:  # beside a busy job: never a finding
        goals["pciebw_busy_findings"] = Goal(sum(len(run["codes"]) for run in busy.values()), 0)
    return {**goals, **{f"agent_{name}": goal for name, goal in agent_goals.items()}}


if __name__ == "__main__":
    cli = parser(__doc__.splitlines()[0])
    cli.add_argument("--sim", metavar="SPEC", help="rehearse on a simulated machine instead")
    cli.add_argument("--agent-minutes", type=float, metavar="M",
                     help="how long the agent is sampled (default 3, --quick 0.5)")
    sys.exit(main(NAME, measure, cli.parse_args()))
