"""Running the real agent in-process for end-to-end tests: the API emulator over HTTP
(through a kubeconfig, as in a pod), the simulated machine under the real pynvml,
short intervals, and a clean teardown through `Agent.stop()`."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import anyio
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from healthd.agent.agent import Agent, Parts
from healthd.config import Config
from healthd.kube.client import Kube
from healthd.kube.conventions import CONDITION_TYPE, Keys
from healthd.sim.apiserver import ApiEmulator
from healthd.sim.machine import MachineSpec, load_machine_spec
from healthd.sim.node import SimulatedNode, simulate

NODE = "gpu-node-1"
KEYS = Keys()
NVML_CHECKS = ("gpus", "remapped", "power", "pcie", "ecc", "nvlink", "xid")
SLOW_CHECKS = ("pciebw", "pvc", "ping", "dcgm")
ROUND_S = 0.2
FOREIGN_LABELS = {"team.example.com/owner": "vision", "nvidia.com/gpu.product": "H100"}
TAINTS = [{"key": "example.com/maintenance", "effect": "NoSchedule", "value": "soon"}]


def node_object(gpus: int = 8) -> dict[str, Any]:
    """A GPU node with another owner's labels, a taint and a cordon."""
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": NODE, "labels": dict(FOREIGN_LABELS)},
        "spec": {"unschedulable": True, "taints": TAINTS},
        "status": {"capacity": {"nvidia.com/gpu": str(gpus)},
                   "allocatable": {"nvidia.com/gpu": str(gpus)}},
    }


def fast_config(**agent: Any) -> Config:
    """NVML checks every ROUND_S, the slow ones off, recovery after 2 passes."""
    checks: dict[str, Any] = {name: {"interval": ROUND_S} for name in NVML_CHECKS}
    checks.update({name: {"enabled": False} for name in SLOW_CHECKS})
    return Config.model_validate({
        "checks": checks,
        "agent": {"xid_window_s": 0.05, "jitter": 0.0, "api_timeout_s": 2, **agent},
    })


def with_intervals(config: Config, **intervals: float) -> Config:
    """`config` with the named checks on, each at its interval (seconds)."""
    sections = {**config.checks, **{name: config.checks["xid"].model_copy(
        update={"interval": seconds, "enabled": True}) for name, seconds in intervals.items()}}
    return config.model_copy(update={"checks": sections})


class Harness:
    """One running agent and what tests look at: the node, events, metrics."""

    def __init__(self, api: ApiEmulator, agent: Agent, sim: SimulatedNode) -> None:
        self.api, self.agent, self.sim = api, agent, sim

    @property
    def parts(self) -> Parts:
        """The agent's connected parts (its health, its publisher, ...)."""
        assert self.agent.parts is not None, "the agent has not connected yet"
        return self.agent.parts

    async def judged(self, within: float = 10.0) -> None:
        """Until the node shows the agent's first judgement, every write of it done. (The
        publisher is in sync before it has anything to write: alone, that says nothing;
        and an agent is ready a moment before its first verdict is handed on.)"""
        await eventually(lambda: self.parts.health.showing and self.parts.publisher.in_sync
                         and self.verdict() is not None, within, "the first judgement written")

    # -- what the user sees on the Node ------------------------------------------------

    def node(self) -> dict[str, Any]:
        return self.api.get("Node", NODE)

    def labels(self) -> dict[str, str]:
        return dict(self.node()["metadata"].get("labels") or {})

    def annotations(self) -> dict[str, str]:
        return dict(self.node()["metadata"].get("annotations") or {})

    def verdict(self) -> str | None:
        return self.labels().get(KEYS.gpuhealth)

    def condition(self) -> dict[str, Any] | None:
        conditions = (self.node().get("status") or {}).get("conditions") or []
        return next((c for c in conditions if c.get("type") == CONDITION_TYPE), None)

    def last_run(self) -> dict[str, Any] | None:
        text = self.annotations().get(KEYS.last_run)
        return json.loads(text) if text else None

    def events(self, reason: str | None = None) -> list[dict[str, Any]]:
        found = [e for e in self.api.list("Event") if reason is None or e.get("reason") == reason]
        return sorted(found, key=lambda e: e["metadata"].get("creationTimestamp") or "")

    def node_writes(self) -> list[Any]:
        return self.api.writes(None, rf"/api/v1/nodes/{NODE}")

    def annotate(self, **annotations: str | None) -> None:
        """What `kubectl annotate node` does (a merge patch), outside the agent."""
        annotate(self.api, **annotations)

    def request(self, text: str, run_id: str | None = None) -> None:
        extra = {KEYS.run_id: run_id} if run_id else {}
        self.annotate(**{KEYS.run: text, **extra})

    # -- metrics -----------------------------------------------------------------------

    def metric(self, name: str, **labels: str) -> float | None:
        return self.agent.registry.get_sample_value(name, labels)

    async def scrape(self, path: str = "/metrics") -> tuple[int, str]:
        async with aiohttp.ClientSession() as session, session.get(
            f"http://127.0.0.1:{self.agent.port}{path}"
        ) as resp:
            return resp.status, (await resp.text()).strip()


def annotate(api: ApiEmulator, **annotations: str | None) -> None:
    """What `kubectl annotate node` does to NODE (None removes), outside any agent."""
    node = api.get("Node", NODE)
    current = dict(node["metadata"].get("annotations") or {})
    for key, value in annotations.items():
        if value is None:
            current.pop(key, None)
        else:
            current[key] = value
    node["metadata"]["annotations"] = current
    api.put(node)


def scraped(port: int, name: str, **labels: str) -> float | None:
    """What an agent process's /metrics on `port` says of the samples `name` with
    `labels` (summed; 0 when it has none), or None while it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    return sum(sample.value for family in text_string_to_metric_families(text)
               for sample in family.samples
               if sample.name == name and labels.items() <= sample.labels.items())


async def eventually(predicate: Callable[[], Any], timeout_s: float = 5.0,
                     what: str = "condition") -> Any:
    """Poll until `predicate()` is truthy (a loose upper bound, never a timing claim)."""
    with anyio.move_on_after(timeout_s):
        while not (value := predicate()):
            await anyio.sleep(0.02)
        return value
    raise AssertionError(f"{what} not reached within {timeout_s} s")


@asynccontextmanager
async def running_agent(api: ApiEmulator, tmp_path: Path, *,
                        spec: str | MachineSpec = "healthy-8xh100",
                        config: Config | None = None, seed: bool = True,
                        wait_ready: bool = True, kube: Kube | None = None,
                        control: Path | None = None) -> AsyncIterator[Harness]:
    """The agent on the test's loop, talking to `api` through a kubeconfig file (or
    through `kube`, a client the test made); on the machine `control` names, when
    given (so a Job's `healthd ... --sim-control` reaches the same machine)."""
    if seed:
        api.seed(node_object())
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    machine = spec if isinstance(spec, MachineSpec) else load_machine_spec(spec)
    with simulate(machine.model_copy(update={"node": NODE}), control) as sim:
        agent = Agent(sim.adapt(config or fast_config()), node=NODE, kubeconfig=str(kubeconfig),
                      kube=kube, probes=sim.probes(),
                      http_port=0, registry=CollectorRegistry())
        async with anyio.create_task_group() as group:
            group.start_soon(agent.run)
            harness = Harness(api, agent, sim)
            if wait_ready:
                await eventually(lambda: agent.ready()[0], 10, "agent ready")
            try:
                yield harness
            finally:
                agent.stop()
                group.cancel_scope.deadline = anyio.current_time() + 10
        if group.cancel_scope.cancelled_caught:
            raise AssertionError("the agent did not stop within 10 s of stop()")
