"""The demo cluster: the API emulator seeded like the MLBatch tutorial cluster, one
real `healthd agent` per simulated GPU node, the real `healthd controller`, and the
AppWrapper operator stand-in, all on one event loop.

What is seeded: namespaces `blue`, `red` and `healthd-system`; ResourceFlavor
`default-flavor`; ClusterQueues `blue-cluster-queue` and `red-cluster-queue` (8 GPUs
each) and `slack-cluster-queue` (8 GPUs, no lendingLimit) in cohort
`default-cohort`; nodes `gpu-node-1..N` with 8 `nvidia.com/gpu` each, and on each an
agent Pod in `healthd-system` (healthd.sim.network). The agents, the controller and
the operator each talk to the emulator over HTTP with their own identity, exactly as
in a cluster; nothing they read is written to the store behind their backs. Only the
NVML library under pynvml is simulated (healthd.sim.multinode).

Two kubelet stand-ins write Pod status straight to the store, as a kubelet would:
the agent Pods' Ready condition follows each agent's own readiness (its /readyz),
so `healthd status` shows what it would in a cluster; and `FakeKubelet`
(healthd.sim.kubelet) runs the Jobs the agents and the controller create (a deep
diagnostic, `healthd trigger --checks dcgm:3`; a GPU reset, with
`controller.repair.enabled`): their pods run their own `healthd check` or `healthd
gpu-reset` command on the machine of the node they are bound to, the one its agent
runs on (healthd.sim.multinode), so a GPU reset there is one the agent sees.

The config is the demo's (healthd.demo.scenario.DEMO_CONFIG) with the scenario's
overrides: the real code paths with short clocks.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
from prometheus_client import CollectorRegistry

from healthd.agent.agent import Agent
from healthd.config import Config
from healthd.controller.controller import Controller
from healthd.controller.metrics import ControllerMetrics
from healthd.demo.scenario import AppWrapperSpec, Scenario, node_names
from healthd.kube.client import Kube
from healthd.kube.conventions import GPU_RESOURCE, Keys
from healthd.kube.objects import APPWRAPPERS
from healthd.sim.apiserver import ApiEmulator
from healthd.sim.appwrapper_operator import AppWrapperOperator
from healthd.sim.kubelet import FakeKubelet, HealthdRunner, Runner, Termination
from healthd.sim.machine import load_machine_spec
from healthd.sim.multinode import SimulatedNodes, simulate_nodes
from healthd.sim.remediation import FakeRebootOperator, Reboot, by_control_file, template
from healthd.sim.shared import spec_file
from healthd.util.http import serve_http

log = logging.getLogger(__name__)

TEAMS = ("blue", "red")
COHORT = "default-cohort"
FLAVOR = "default-flavor"
SLACK_QUEUE = "slack-cluster-queue"
SYSTEM_NAMESPACE = "healthd-system"
GPUS_PER_QUEUE = 8
CONTROLLER_ID = "healthd-controller-0"
ADMIN = "admin"
REBOOT_OPERATOR_ID = "system:serviceaccount:medik8s:self-node-remediation"
STOP_S = 5.0  # everything stops within this after the story
PROBE_S = 1.0  # the kubelet's readiness probe period for the agent Pods
Obj = dict[str, Any]

# -- objects --------------------------------------------------------------------------


def _namespace(name: str) -> Obj:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def cluster_queue(name: str, gpus: int, *, namespaces: list[str] | None = None) -> Obj:
    """A ClusterQueue of `gpus` GPUs in the tutorial's cohort (for `namespaces` only)."""
    selector = ({"matchExpressions": [{"key": "kubernetes.io/metadata.name",
                                       "operator": "In", "values": namespaces}]}
                if namespaces else {})
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
            "metadata": {"name": name},
            "spec": {"cohortName": COHORT, "namespaceSelector": selector,
                     "resourceGroups": [{"coveredResources": [GPU_RESOURCE], "flavors": [
                         {"name": FLAVOR, "resources": [
                             {"name": GPU_RESOURCE, "nominalQuota": str(gpus)}]}]}]}}


def node_object(name: str, gpus: int, model: str) -> Obj:
    capacity = {GPU_RESOURCE: str(gpus), "cpu": "96", "memory": "1Ti", "pods": "110"}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {
                "kubernetes.io/hostname": name,
                "nvidia.com/gpu.product": model.replace(" ", "-"),
                "nvidia.com/gpu.count": str(gpus)}},
            "spec": {},
            "status": {"capacity": capacity, "allocatable": capacity,
                       "conditions": [{"type": "Ready", "status": "True",
                                       "reason": "KubeletReady"}]}}


def _readiness(ready: bool) -> Obj:
    return {"conditions": [{"type": "Ready", "status": str(ready)}],
            "containerStatuses": [{"name": "agent", "ready": ready, "restartCount": 0,
                                   "state": {"running": {}}}]}


def cluster_objects(nodes: list[str], gpus: int, model: str) -> list[Obj]:
    """What the tutorial cluster holds before the story: see the module docstring."""
    return [*(_namespace(n) for n in (*TEAMS, SYSTEM_NAMESPACE)),
            {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
             "metadata": {"name": FLAVOR}, "spec": {}},
            *(cluster_queue(f"{team}-cluster-queue", GPUS_PER_QUEUE, namespaces=[team])
              for team in TEAMS),
            cluster_queue(SLACK_QUEUE, GPUS_PER_QUEUE),
            *(node_object(name, gpus, model) for name in nodes)]


def appwrapper_object(spec: AppWrapperSpec) -> Obj:
    """An AppWrapper wrapping a batch/v1 Job of `pods` pods of `gpus_per_pod` GPUs."""
    container = {"name": "trainer", "image": "registry.example.com/trainer:latest",
                 "command": ["sleep", "infinity"],
                 "resources": {"requests": {GPU_RESOURCE: str(spec.gpus_per_pod)},
                               "limits": {GPU_RESOURCE: str(spec.gpus_per_pod)}}}
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": spec.name},
           "spec": {"parallelism": spec.pods, "completions": spec.pods, "template": {
               "spec": {"restartPolicy": "Never", "containers": [container]}}}}
    return {"apiVersion": APPWRAPPERS.api_version, "kind": "AppWrapper",
            "metadata": {"name": spec.name, "namespace": spec.namespace,
                         "labels": {"kueue.x-k8s.io/queue-name": "default-queue"}},
            "spec": {"suspend": False, "components": [
                {"template": job,
                 "podSets": [{"replicas": spec.pods, "path": "template.spec.template"}]}]}}


# -- the running cluster --------------------------------------------------------------


@dataclass
class DemoCluster:
    """Everything the player and the view look at and act through."""

    api: ApiEmulator
    config: Config
    admin: Kube  # what an administrator's kubectl would be
    fleet: SimulatedNodes
    operator: AppWrapperOperator
    controller: Controller
    agents: dict[str, Agent] = field(default_factory=dict)
    controller_port: int | None = None

    @property
    def keys(self) -> Keys:
        return Keys(self.config.label_prefix, self.config.own_prefix)

    @property
    def nodes(self) -> list[str]:
        return list(self.agents)

    def agent_ports(self) -> dict[str, int | None]:
        return {name: agent.port for name, agent in self.agents.items()}


class _Clients:
    """One Kube client per identity, all closed together."""

    def __init__(self, api: ApiEmulator, stack: AsyncExitStack) -> None:
        self.api, self.stack = api, stack

    def __call__(self, user: str) -> Kube:
        kube = Kube(self.api.async_client(user=user), timeout_s=5)
        self.stack.push_async_callback(kube.close)
        return kube


@asynccontextmanager
async def running_cluster(scenario: Scenario, config: Config, *, nodes: int,
                          port: int = 0) -> AsyncIterator[DemoCluster]:
    """Start the emulator (on `port`; 0 = any), seed it, start every component;
    stop them all on exit."""
    names = node_names(nodes)
    machine = load_machine_spec(scenario.machine)
    async with ApiEmulator(port=port) as api, AsyncExitStack() as stack:
        api.seed(*cluster_objects(names, machine.gpus.count, machine.gpus.model))
        client = _Clients(api, stack)
        fleet = stack.enter_context(simulate_nodes({n: machine for n in names}))
        # The agents' own pods, with the pod network and net1 in their network-status:
        # what ping's peers and the nic check's interfaces come from.
        api.seed(*(fleet.network.agent_pod(n) for n in names))
        cluster = DemoCluster(
            api=api, config=config, admin=client(ADMIN), fleet=fleet,
            operator=AppWrapperOperator(client("system:serviceaccount:appwrapper-system:"
                                               "appwrapper-controller-manager"),
                                        keys=Keys(config.label_prefix, config.own_prefix)),
            controller=Controller(config, kube=client(CONTROLLER_ID), identity=CONTROLLER_ID,
                                  metrics=ControllerMetrics(CollectorRegistry())))
        async with anyio.create_task_group() as group:
            for name in names:
                sim = fleet.nodes[name]
                agent = Agent(sim.adapt(config), node=name, kube=client(f"system:node:{name}"),
                              probes=sim.probes(), http_port=0,
                              registry=CollectorRegistry())
                cluster.agents[name] = agent
                group.start_soon(fleet.run_bound, name, agent.run)
            group.start_soon(_serve_controller, cluster)
            group.start_soon(cluster.operator.run)
            group.start_soon(_probe_agents, cluster)
            group.start_soon(FakeKubelet(api, runner=on_its_node(fleet)).run)
            if (ref := config.controller.repair.reboot) is not None:
                # The cluster's reboot remediation (medik8s Self Node Remediation's
                # stand-in) and the admin's template the config names.
                api.seed(template(ref.name, ref.namespace))
                group.start_soon(FakeRebootOperator(client(REBOOT_OPERATOR_ID),
                                                    reboots_its_node(fleet)).run)
            try:
                yield cluster
            finally:
                group.cancel_scope.cancel()
                group.cancel_scope.deadline = anyio.current_time() + STOP_S


def on_its_node(fleet: SimulatedNodes) -> Runner:
    """The kubelet's runner: a pod's `healthd ...` command runs on the machine of the
    node it is bound to (its spec and control file), as it would on that node."""
    runners = {name: HealthdRunner(spec_file(sim.control), control=sim.control)
               for name, sim in fleet.nodes.items() if sim.control is not None}

    async def run(pod: Obj) -> Termination:
        return await runners[pod["spec"]["nodeName"]](pod)

    return run


def reboots_its_node(fleet: SimulatedNodes) -> Reboot:
    """The reboot operator's hand on each node: its machine's control file."""
    return by_control_file({name: sim.control for name, sim in fleet.nodes.items()
                            if sim.control is not None})


async def _serve_controller(cluster: DemoCluster) -> None:
    controller = cluster.controller
    async with serve_http(0, controller.metrics.registry, healthy=lambda: (True, ""),
                          ready=controller.ready) as port:
        cluster.controller_port = port
        await controller.run()


async def _probe_agents(cluster: DemoCluster) -> None:
    """The kubelet's readiness probe: each agent Pod's Ready condition follows its
    agent's readiness, written only when it changes."""
    shown: dict[str, bool] = {}
    namespace = cluster.fleet.network.namespace
    while True:
        for name, agent in cluster.agents.items():
            ready = agent.ready()[0]
            pod = cluster.api.get("Pod", f"healthd-agent-{name}", namespace)
            if pod is not None and shown.get(name) != ready:
                pod["status"] = {**pod["status"], **_readiness(ready)}
                cluster.api.put(pod)
                shown[name] = ready
        await anyio.sleep(PROBE_S)
