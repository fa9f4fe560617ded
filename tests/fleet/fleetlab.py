"""A simulated fleet for the fleet tools: GPU nodes in the API emulator, REAL agents
running in-process on some of them (one simulated machine under the real pynvml,
shared), agent pods, and the `healthd` command line driven in-process."""

from __future__ import annotations

import io
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
from prometheus_client import CollectorRegistry

from healthd.agent.agent import Agent
from healthd.cli import build_parser
from healthd.config import Config
from healthd.fleet.command import status_command, trigger_command
from healthd.kube.conventions import Keys
from healthd.sim.apiserver import ApiEmulator
from healthd.sim.machine import load_machine_spec
from healthd.sim.node import simulate
from healthd.util.exits import ExitError
from tests.agent.harness import eventually

KEYS = Keys()
GPU = "nvidia.com/gpu"
AGENT_NAMESPACE = "healthd-system"
AGENT_LABELS = {"app.kubernetes.io/name": "healthd-agent"}
NVML_CHECKS = ("gpus", "remapped", "power", "pcie", "ecc", "nvlink")
QUIET_CHECKS = ("pciebw", "pvc", "ping", "dcgm", "xid")
Obj = dict[str, Any]


def gpu_node(name: str, *, gpus: int = 8, labels: dict[str, str] | None = None,
             verdict: str | None = None, annotations: dict[str, str] | None = None,
             unschedulable: bool = False) -> Obj:
    all_labels = {"pool": "a", **(labels or {})}
    if verdict is not None:
        all_labels[KEYS.gpuhealth] = verdict
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": all_labels,
                         "annotations": dict(annotations or {})},
            "spec": {"unschedulable": unschedulable},
            "status": {"capacity": {GPU: str(gpus), "cpu": "64"},
                       "allocatable": {GPU: str(gpus), "cpu": "64"}}}


def pod(name: str, node: str, *, namespace: str = "team", gpus: int = 0,
        labels: dict[str, str] | None = None, phase: str = "Running") -> Obj:
    resources = {"requests": {GPU: str(gpus)}, "limits": {GPU: str(gpus)}} if gpus else {}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {})},
            "spec": {"nodeName": node,
                     "containers": [{"name": "main", "image": "x", "resources": resources}]},
            "status": {"phase": phase}}


def agent_pod(node: str, *, ready: bool = True, restarts: int = 0,
              restarted_at: str | None = None) -> Obj:
    """A running agent pod as the kubelet shows it: Ready per its probe, restarts."""
    agent = pod(f"healthd-agent-{node}", node, namespace=AGENT_NAMESPACE, labels=AGENT_LABELS)
    container: Obj = {"name": "agent", "ready": ready, "restartCount": restarts,
                      "state": {"running": {}}}
    if restarted_at is not None:
        container["lastState"] = {"terminated": {"exitCode": 1, "finishedAt": restarted_at}}
    agent["status"].update(conditions=[{"type": "Ready", "status": str(ready)}],
                           containerStatuses=[container])
    return agent


def quiet_config() -> Config:
    """Each agent runs its first round, then only what it is asked (no periodic load)."""
    checks: dict[str, Any] = {name: {"interval": "1h"} for name in NVML_CHECKS}
    checks.update({name: {"enabled": False} for name in QUIET_CHECKS})
    return Config.model_validate({
        "checks": checks,
        "agent": {"jitter": 0.0, "api_timeout_s": 2, "shutdown_flush_s": 1},
    })


@asynccontextmanager
async def running_agents(api: ApiEmulator, tmp_path: Path,
                         nodes: Sequence[str]) -> AsyncIterator[list[Agent]]:
    """A real agent per node in `nodes` (the nodes must be seeded), all ready."""
    kubeconfig = str(api.write_kubeconfig(tmp_path / "agents.kubeconfig"))
    spec = load_machine_spec("healthy-8xh100")
    with simulate(spec) as sim:
        agents = [Agent(sim.adapt(quiet_config()), node=n, kubeconfig=kubeconfig,
                        probes=sim.probes(), http_port=0,
                        registry=CollectorRegistry()) for n in nodes]
        async with anyio.create_task_group() as group:
            for agent in agents:
                group.start_soon(agent.run)
            try:
                await eventually(lambda: all(a.ready()[0] for a in agents), 30, "agents ready")
                # Ready is the first round done; its verdict reaches the Node just after.
                await eventually(lambda: all(_verdict(api, n) for n in nodes), 30, "verdicts")
                yield agents
            finally:
                for agent in agents:
                    agent.stop()
                group.cancel_scope.deadline = anyio.current_time() + 10


def _verdict(api: ApiEmulator, node: str) -> str | None:
    obj = api.get("Node", node) or {}
    return ((obj.get("metadata") or {}).get("labels") or {}).get(KEYS.gpuhealth)


class Terminal(io.StringIO):
    """Output that says it is a terminal (the progress line shows there only)."""

    def isatty(self) -> bool:
        return True


class Run:
    """What one command printed and returned."""

    def __init__(self, code: int, out: str, err: str) -> None:
        self.code, self.out, self.err = code, out, err


async def healthd(api: ApiEmulator, tmp_path: Path, *argv: str,
                  stop: anyio.Event | None = None,
                  clock: Callable[[], float] = time.time, tty: bool = False) -> Run:
    """`healthd trigger|status ARGS --kubeconfig <the emulator>` in-process."""
    kubeconfig = api.write_kubeconfig(tmp_path / "admin.kubeconfig")
    args = build_parser().parse_args([*argv, "--kubeconfig", str(kubeconfig)])
    out, err = (Terminal(), Terminal()) if tty else (io.StringIO(), io.StringIO())
    try:
        if args.command == "trigger":
            code = await trigger_command(args, out=out, err=err, stop=stop)
        else:
            code = await status_command(args, out=out, clock=clock)
    except ExitError as exc:
        err.write(f"healthd: {exc}\n")
        code = exc.code
    return Run(code, out.getvalue(), err.getvalue())
