"""A repaired node end to end on the API emulator: the real agent on a simulated
machine (in-process), the real controller (with repairs on), the fake Job
controller, scheduler and kubelet, which run the GPU-reset Job's own `healthd
gpu-reset` command on that same machine (its control file), through the simulated
nvidia-smi, and, where a test asks, the fake reboot operator (healthd.sim.remediation),
which reboots that machine when a reboot request names the node. What the tests read
is what a user sees: the Node's label, its annotations, Events, the Jobs, the reboot
requests, the controller's metrics."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest

from healthd.config import Config
from healthd.config.controller import ControllerSettings
from healthd.sim.apiserver import ApiEmulator
from healthd.sim.apiserver.testing import api  # noqa: F401
from healthd.sim.holders import hold, release
from healthd.sim.kubelet import FakeKubelet, HealthdRunner
from healthd.sim.machine import MachineSpec, load_machine_spec
from healthd.sim.operands import FakeOperands, operand_labels
from healthd.sim.remediation import FakeRebootOperator, by_control_file, template
from tests.agent.harness import KEYS, NODE, Harness, fast_config, running_agent
from tests.controller.conftest import (  # noqa: F401  (pytest fixtures)
    KubeFactory,
    Replica,
    controllers,
    kube_for,
)

pytestmark = pytest.mark.anyio
Obj = dict[str, Any]
GPU = "nvidia.com/gpu"
REPAIR_NS = "healthd-system-repair"
REPAIR = "healthd.io/repair"
OPT_OUT = "remediation.medik8s.io/exclude-from-remediation"
BOOT_ID = "boot-1"
SNR_NS = "medik8s"  # where the remediation template and the requests live
SNR = "SelfNodeRemediation"
TEMPLATE = {"apiVersion": "remediation.medik8s.io/v1alpha1",
            "kind": "SelfNodeRemediationTemplate", "namespace": SNR_NS, "name": "automatic"}
TEMPLATE_SPEC = {"remediationStrategy": "Automatic"}


def snr_template() -> Obj:
    """The admin's template the configured reference names."""
    return template(TEMPLATE["name"], SNR_NS, TEMPLATE_SPEC)


def gpu_node(*, labels: dict[str, str] | None = None, cordoned: bool = False) -> Obj:
    capacity = {GPU: "8", "cpu": "64", "memory": "512Gi", "pods": "110"}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": NODE, "labels": dict(labels or {}), "annotations": {}},
            "spec": {"unschedulable": True} if cordoned else {},
            "status": {"capacity": capacity, "allocatable": capacity,
                       "nodeInfo": {"bootID": BOOT_ID}}}


def gpu_uuid(gpu: int) -> str:
    """A GPU UUID in NVML's syntax for position `gpu` of a test node."""
    return f"GPU-{gpu:08x}-0000-4000-8000-000000000000"


def holding_node(code: str, check: str, gpu: int, severity: str, *,
                 sticky: bool = False) -> Obj:
    """A GPU node whose agent (not running) published `code` held on GPU `gpu`: what
    the controller reads without an agent to play it."""
    node = gpu_node()
    held = {"code": code, "check": check, "entity": f"gpu{gpu}", "severity": severity,
            "sticky": sticky, "message": "", "since": "2026-01-01T00:00:00Z",
            "uuid": gpu_uuid(gpu)}
    node["metadata"]["labels"][KEYS.gpuhealth] = severity
    node["metadata"]["annotations"][KEYS.health] = json.dumps(
        {"verdict": severity, "since": "2026-01-01T00:00:00Z", "top": code,
         "held": [held], "findings": [], "checks": {}})
    return node


def gpu_pod(name: str = "trainer-0") -> Obj:
    """A running pod of AppWrapper `trainer` holding 2 of the node's GPUs."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "team-a",
                         "labels": {"workload.codeflare.dev/appwrapper": "trainer"}},
            "spec": {"nodeName": NODE, "containers": [
                {"name": "main", "image": "trainer",
                 "resources": {"requests": {GPU: "2"}, "limits": {GPU: "2"}}}]},
            "status": {"phase": "Running"}}


def controller_config(**repair: Any) -> Config:
    """The agents' checks (so the validation set is what they run) and a controller
    that repairs, with test timings."""
    controller = ControllerSettings.model_validate({
        "election": {"lease_duration": "1s", "renew_deadline": "500ms",
                     "retry_period": "100ms"},
        "breaker": {"hold": "1s"},
        # Test timings: the pause between attempts is a minute in production.
        "repair": {"enabled": True, "validation_timeout": "60s", "attempt_pause": "200ms",
                   **repair}})
    return fast_config().model_copy(update={"controller": controller})


def hardware(spec: MachineSpec) -> MachineSpec:
    """`spec` with every fault marked as surviving resets and reboots."""
    faults = [f.model_copy(update={"hardware": True}) for f in spec.faults]
    return spec.model_copy(update={"faults": faults})


async def agent_lets_go(emulator: ApiEmulator, name: str = NODE) -> None:
    """The agent's part in a reset, for a test that plays the agent: while the record
    says `resetting`, the node shows `healthd.io/nvml-released` for its Job, as the
    agent writes it once its NVML session has ended. Runs until cancelled."""
    while True:
        node = emulator.get("Node", name)
        annotations = (node or {}).get("metadata", {}).get("annotations") or {}
        try:
            doc = json.loads(annotations.get(REPAIR) or "{}")
        except ValueError:
            doc = {}
        job = doc.get("job") if doc.get("state") == "resetting" else None
        if node is not None and job and annotations.get(KEYS.nvml_released) != job:
            node["metadata"]["annotations"][KEYS.nvml_released] = job
            emulator.put(node)
        await anyio.sleep(0.05)


def holding_on(control: Path) -> Callable[[str, str, bool], None]:
    """An operand pod holds every GPU of the machine `control` names while it runs."""
    def holds(_node: str, pod: str, running: bool) -> None:
        (hold(control, pod) if running else release(control, pod))
    return holds


@dataclass
class Cluster:
    api: ApiEmulator
    agent: Harness
    kubelet: FakeKubelet
    replica: Replica
    control: Path  # the control file of the node's machine
    operator: FakeRebootOperator | None = None
    gpu_operator: FakeOperands | None = None

    def node(self) -> Obj:
        return self.api.get("Node", NODE)

    def repair(self) -> Obj | None:
        text = (self.node()["metadata"].get("annotations") or {}).get(REPAIR)
        return json.loads(text) if text else None

    def state(self) -> str | None:
        doc = self.repair()
        return None if doc is None else str(doc["state"])

    def jobs(self) -> list[Obj]:
        return list(self.api.list("Job", REPAIR_NS))

    def requests(self) -> list[Obj]:
        """The reboot requests (SelfNodeRemediations) that exist now."""
        return list(self.api.list(SNR, SNR_NS))

    def requests_created(self) -> int:
        """Accepted creates of reboot requests, whoever made them."""
        return len([r for r in self.api.writes("POST", r".*/selfnoderemediations")
                    if r.status == 201])

    def events(self, reason: str) -> list[Obj]:
        return [e for e in self.api.list("Event") if e.get("reason") == reason
                and e["involvedObject"].get("name") == NODE]

    def repair_writes(self) -> list[Any]:
        """Accepted Node writes by the controller (its API user is `ctl`)."""
        return [r for r in self.api.writes("PATCH", rf"/api/v1/nodes/{NODE}")
                if r.status == 200 and r.user == "ctl"]

    def metric(self, name: str, **labels: str) -> float:
        return self.replica.sample(name, labels)


async def labels_until_settled(c: Cluster, settled: Callable[[], bool],
                               within: float = 60.0) -> list[str | None]:
    """The node's label values, each change once, until `settled()` holds; the value
    that settles it is always the last one seen (read in the same turn)."""
    seen: list[str | None] = []
    with anyio.fail_after(within):
        while True:
            if not seen or seen[-1] != c.agent.verdict():
                seen.append(c.agent.verdict())
            if settled():
                return seen
            await anyio.sleep(0.02)


@asynccontextmanager
async def cluster(api: ApiEmulator, kube_for: KubeFactory, tmp_path: Path,  # noqa: F811
                  *, spec: str | MachineSpec = "remap-pending", node: Obj | None = None,
                  config: Config | None = None, pods: tuple[Obj, ...] = (),
                  template: bool = False, reboots: bool = False,
                  operands: bool = False) -> AsyncIterator[Cluster]:
    """The node (seeded), its agent, the kubelet playing Jobs on its machine, and one
    controller replica `ctl`; with `template`, the remediation template; with
    `reboots`, that and the fake reboot operator for the machine; with `operands`,
    the GPU Operator's operands on the node (labelled for them), each pod holding the
    machine's GPUs while it runs."""
    machine = spec if isinstance(spec, MachineSpec) else load_machine_spec(spec)
    machine = machine.model_copy(update={"node": NODE})
    spec_file, control = tmp_path / "machine.json", tmp_path / "machine.control"
    spec_file.write_text(machine.model_dump_json())
    control.touch()
    node = node or gpu_node(labels=operand_labels() if operands else None)
    api.seed(node, *pods, *((snr_template(),) if template or reboots else ()))
    kubelet = FakeKubelet(api, runner=HealthdRunner(spec_file, control=control))
    gpu_operator = FakeOperands(api, hold=holding_on(control)) if operands else None
    operator = FakeRebootOperator(kube_for("reboot-operator"),
                                  by_control_file({NODE: control})) \
        if reboots else None
    async with anyio.create_task_group() as group:
        group.start_soon(kubelet.run)
        if operator is not None:
            group.start_soon(operator.run)
        if gpu_operator is not None:
            group.start_soon(gpu_operator.run)
        config = config or controller_config()  # one config file, as in the cluster
        async with running_agent(api, tmp_path, spec=machine, seed=False, config=config,
                                 control=control) as agent, \
                controllers(kube_for, config, "ctl") as (replica,):
            yield Cluster(api, agent, kubelet, replica, control, operator, gpu_operator)
        group.cancel_scope.cancel()
