"""healthd on the real control plane, as an SRE installs and runs it.

The manifests (`kubectl kustomize deploy/daemonset/overlays/device-plugin`) are applied
with server-side apply: the namespace, RBAC, the admission policy, the config, the
agent DaemonSet and the controller Deployment. kwok plays the GPU nodes and runs their
Pods (it runs no containers), so each agent runs here as a process on a simulated
machine, as its DaemonSet Pod would: with NODE_NAME and POD_NAME from that Pod and a
token bound to it (TokenRequest), so the API server sees the agent's real identity,
node name included. The controller likewise runs as one of its Deployment's Pods.
"""

from __future__ import annotations

import base64
import contextlib
import json
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s

from tests.deploy.manifests import OVERLAYS, PROBES, find, render
from tests.e2e.mlbatch import APPWRAPPERS
from tests.realcluster.apply import Applier, api_client
from tests.realcluster.processes import Program, log_tail

NAMESPACE = "healthd-system"
GPU_NODE_LABEL = "healthd.io/gpu-node"  # the device-plugin overlay's agent selector
GPU = "nvidia.com/gpu"
HEALTHD = [sys.executable, "-m", "healthd.cli"]
Obj = dict[str, Any]

# Short clocks, the real code paths (like the demo's config).
TEST_CONFIG: Obj = {
    "checks": {**{name: {"interval": "1s"} for name in
                  ("gpus", "remapped", "power", "pcie", "ecc", "nvlink", "xid")},
               **{name: {"enabled": False} for name in ("pciebw", "ping", "dcgm", "pvc")}},
    "agent": {"recover_after": 2, "jitter": 0.0, "api_timeout_s": 5, "shutdown_flush_s": 1},
    "controller": {
        "slack_queues": ["slack-cluster-queue"],
        "breaker": {"max_unhealthy": "60%", "window": "1m", "hold": "3s"},
        "resets": {"min_spacing": "20s"},
        "election": {"lease_duration": "4s", "renew_deadline": "3s", "retry_period": "500ms"},
    },
}


def eventually(predicate: Callable[[], Any], timeout_s: float, what: str,
               poll_s: float = 0.25) -> Any:
    """The first truthy value of `predicate()`, or AssertionError naming `what`."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        with contextlib.suppress(k8s.ApiException):
            last = predicate()
            if last:
                return last
        time.sleep(poll_s)
    raise AssertionError(f"no {what} within {timeout_s:.0f} s (last: {last!r})")


def merge(base: Obj, over: Obj) -> Obj:
    out = dict(base)
    for key, value in over.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(
            out.get(key), dict) else value
    return out


SYSTEM_NODES = ("e2e-system-1", "e2e-system-2")  # two: the controller's replicas spread


def system_node(name: str) -> Obj:
    """A kwok node without GPUs, for the cluster's own Pods; never removed."""
    node = gpu_node(name, gpus=0)
    node["metadata"]["labels"] = {"kubernetes.io/hostname": name, "type": "kwok"}
    return node


def gpu_node(name: str, gpus: int = 8) -> Obj:
    """A kwok node with `gpus` GPUs that healthd's agent selects."""
    capacity = {GPU: str(gpus), "cpu": "96", "memory": "1Ti", "pods": "110"}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name,
                         "annotations": {"kwok.x-k8s.io/node": "fake"},
                         "labels": {"kubernetes.io/hostname": name, "type": "kwok",
                                    GPU_NODE_LABEL: "true",
                                    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
            "spec": {},
            "status": {"capacity": capacity, "allocatable": capacity}}


@dataclass
class Process:
    program: Program
    control: Path | None = None

    def fault(self, **command: Any) -> None:
        """A change to the agent's simulated machine (healthd.sim.control)."""
        assert self.control is not None
        with open(self.control, "a") as handle:
            handle.write(json.dumps(command) + "\n")

    def logs(self) -> str:
        return log_tail(self.program.log, 6000)

    def messages(self) -> list[str]:
        """Every message the program has logged so far (its JSON lines), in order."""
        out = []
        for line in self.program.log.read_text(errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue  # not a log record: a traceback's lines, a library's print
            if isinstance(record, dict) and "message" in record:
                out.append(str(record["message"]))
        return out


@dataclass
class Healthd:
    """healthd installed on one cluster; agents and controller as processes."""

    kubeconfig: Path
    root: Path
    config: Obj = field(default_factory=lambda: dict(TEST_CONFIG))
    objects: list[Obj] = field(default_factory=list)
    agents: dict[str, Process] = field(default_factory=dict)
    controller: Process | None = None
    nodes: list[str] = field(default_factory=list)  # what add_nodes made, removed at the end
    # Annotations of the nodes add_nodes makes, e.g. how kwok keeps them alive
    # (tests.realcluster.cluster.KUBELET_HEARTBEAT).
    node_annotations: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.client = api_client(self.kubeconfig)
        self.applier = Applier(self.client)
        self.core = k8s.CoreV1Api(self.client)
        self.custom = k8s.CustomObjectsApi(self.client)

    # -- install ------------------------------------------------------------------------

    def install(self) -> list[Obj]:
        """The manifests, applied; and the nodes a cluster's system Pods (healthd's
        controller) live on, which no test removes."""
        self.objects = render(OVERLAYS["device-plugin"])
        self._namespace_gone_or_active()
        self.applier.apply(self.objects)
        self.applier.apply(system_node(name) for name in SYSTEM_NODES)
        return self.objects

    def uninstall(self) -> None:
        """Everything the manifests made, the namespace included (as `kubectl delete
        -k` would), once it is gone: the cluster is ready for another installation."""
        self.stop()
        self.applier.delete(reversed(self.objects or render(OVERLAYS["device-plugin"])))
        self._namespace_gone_or_active(require_gone=True)

    def _namespace_gone_or_active(self, require_gone: bool = False) -> None:
        def settled(name: str) -> bool:
            try:
                namespace = self.core.read_namespace(name)
            except k8s.ApiException as exc:
                if exc.status == 404:
                    return True
                raise
            return not require_gone and namespace.status.phase != "Terminating"
        for name in (NAMESPACE, PROBES):
            eventually(lambda n=name: settled(n), 120,  # type: ignore[misc]
                       f"namespace {name} {'gone' if require_gone else 'usable'}")

    def config_file(self, **overrides: Any) -> Path:
        """The installed ConfigMap's config with the test's short clocks."""
        configmap = find(self.objects, "ConfigMap")[0]
        shipped = yaml.safe_load(configmap["data"]["config.yaml"]) or {}
        path = self.root / f"config-{len(list(self.root.glob('config-*')))}.yaml"
        path.write_text(yaml.safe_dump(merge(merge(shipped, self.config), overrides)))
        return path

    # -- nodes and pods -----------------------------------------------------------------

    def add_nodes(self, *names: str, gpus: int = 8) -> None:
        nodes = [gpu_node(n, gpus) for n in names]
        for node in nodes:
            node["metadata"]["annotations"].update(self.node_annotations)
        self.applier.apply(nodes)
        self.nodes += names
        for name in names:
            eventually(lambda n=name: self._ready(n), 60, f"node {name} Ready (kwok)")

    def _ready(self, name: str) -> bool:
        node = self.core.read_node(name)
        return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])

    def node(self, name: str) -> Obj:
        return self.client.sanitize_for_serialization(self.core.read_node(name))

    def label(self, name: str, key: str = "autopilot.ibm.com/gpuhealth") -> str | None:
        return (self.node(name)["metadata"].get("labels") or {}).get(key)

    def running_pod(self, selector: str, node: str | None = None) -> Obj:
        """The first Running Pod of healthd's that matches (on `node` if given)."""
        def found() -> Obj | None:
            fields = f"spec.nodeName={node}" if node else None
            pods = self.core.list_namespaced_pod(NAMESPACE, label_selector=selector,
                                                 field_selector=fields).items
            # A Pod whose node is gone is about to be collected, its tokens with it.
            running = [p for p in pods if p.status.phase == "Running"
                       and p.metadata.deletion_timestamp is None
                       and self._node_exists(p.spec.node_name)]
            return self.client.sanitize_for_serialization(running[0]) if running else None
        return eventually(found, 90, f"a Running pod {selector} on {node or 'any node'}")

    def agent_pod(self, node: str) -> Obj:
        """The agent Pod the DaemonSet bound to `node`, in any phase (a node without
        kwok runs no Pod, but a token bound to the Pod still names the node)."""
        def bound() -> Obj | None:
            pods = self.core.list_namespaced_pod(
                NAMESPACE, label_selector="app.kubernetes.io/name=healthd-agent",
                field_selector=f"spec.nodeName={node}").items
            alive = [p for p in pods if p.metadata.deletion_timestamp is None]
            return self.client.sanitize_for_serialization(alive[0]) if alive else None
        return eventually(bound, 90, f"the agent Pod bound to {node}")

    def _node_exists(self, name: str) -> bool:
        try:
            return self.core.read_node(name).metadata.deletion_timestamp is None
        except k8s.ApiException as exc:
            if exc.status == 404:
                return False
            raise

    def token_for(self, pod: Obj, service_account: str) -> str:
        """A token bound to `pod`, as the kubelet mounts one into it."""
        request = k8s.AuthenticationV1TokenRequest(spec=k8s.V1TokenRequestSpec(
            audiences=[], expiration_seconds=3600,
            bound_object_ref=k8s.V1BoundObjectReference(
                kind="Pod", api_version="v1", name=pod["metadata"]["name"],
                uid=pod["metadata"]["uid"])))
        answer = self.core.create_namespaced_service_account_token(
            service_account, NAMESPACE, request)
        return str(answer.status.token)

    def token_kubeconfig(self, token: str, path: Path, server: str | None = None) -> Path:
        """A kubeconfig for `token`, for the API server or `server` (a proxy)."""
        from tests.realcluster.cluster import kubeconfig

        cluster = yaml.safe_load(self.kubeconfig.read_text())["clusters"][0]["cluster"]
        ca = self.root / "ca.crt"
        if not ca.exists():
            ca.write_bytes(base64.b64decode(cluster["certificate-authority-data"]))
        path.write_text(kubeconfig(server or cluster["server"], ca, user={"token": token}))
        return path

    def _kubeconfig_for(self, pod: Obj, service_account: str,
                        server: str | None = None) -> Path:
        """A kubeconfig with a token bound to `pod`, for the API server or `server`
        (another address of it, such as a proxy in front)."""
        return self.token_kubeconfig(self.token_for(pod, service_account),
                                     self.root / f"{pod['metadata']['name']}.kubeconfig",
                                     server)

    def wait_for_node_policy(self, agent: k8s.CoreV1Api, foreign_node: str) -> None:
        """Wait until the API server enforces the node policy on `agent`'s writes: a
        new ValidatingAdmissionPolicy is in force a moment after it is created. The
        probe, a write to another node's verdict, is a dry run: admission judges it,
        nothing is stored either way."""
        probe = {"metadata": {"labels": {"autopilot.ibm.com/gpuhealth": "EVICT"}}}

        def refused() -> bool:
            try:
                agent.patch_node(foreign_node, probe, dry_run="All")
            except k8s.ApiException as exc:
                return exc.status == 403
            return False
        eventually(refused, 30, "the node policy in force")

    def client_for(self, token: str) -> k8s.ApiClient:
        """An API client with `token` (another identity than the admin's)."""
        return api_client(self.token_kubeconfig(
            token, self.root / f"token-{uuid.uuid4().hex[:6]}.kubeconfig"))

    # -- the programs -------------------------------------------------------------------

    def start_agent(self, node: str, *, sim: str = "healthy-8xh100", server: str | None = None,
                    **overrides: Any) -> Process:
        pod = self.running_pod("app.kubernetes.io/name=healthd-agent", node)
        control = self.root / f"{node}.control.jsonl"
        control.touch()
        program = Program(f"agent-{node}", [
            *HEALTHD, "agent", "--sim", sim, "--sim-control", str(control),
            "--kubeconfig", str(self._kubeconfig_for(pod, "healthd-agent", server)),
            "--config", str(self.config_file(**overrides)), "--http-port", "0"],
            self.root / f"agent-{node}.log",
            {"NODE_NAME": node, "POD_NAME": pod["metadata"]["name"],
             "POD_NAMESPACE": NAMESPACE})
        program.start()
        self.agents[node] = Process(program, control)
        return self.agents[node]

    def start_controller(self, *, server: str | None = None, **overrides: Any) -> Process:
        pod = self.running_pod("app.kubernetes.io/name=healthd-controller")
        program = Program("controller", [
            *HEALTHD, "controller",
            "--kubeconfig", str(self._kubeconfig_for(pod, "healthd-controller", server)),
            "--config", str(self.config_file(**overrides)), "--http-port", "0"],
            self.root / "controller.log",
            {"POD_NAME": pod["metadata"]["name"], "POD_NAMESPACE": NAMESPACE})
        program.start()
        self.controller = Process(program)
        return self.controller

    def start_fleet(self, tag: str, count: int, *, server: str | None = None,
                    **controller: Any) -> list[str]:
        """`count` new GPU nodes named after `tag`, an agent on each and the controller
        (its config section overridden by `controller`; all talking to `server` when
        given); returns once all are PASS."""
        suffix = uuid.uuid4().hex[:5]
        nodes = [f"{tag}-{suffix}-{i}" for i in range(1, count + 1)]
        self.add_nodes(*nodes)
        for node in nodes:
            self.start_agent(node, server=server)
        self.start_controller(server=server, controller=controller)
        for node in nodes:
            eventually(lambda n=node: self.label(n) == "PASS", 90,  # type: ignore[misc]
                       f"PASS on {node}")
        return nodes

    def stop(self) -> None:
        for process in [*self.agents.values(), *([self.controller] if self.controller else [])]:
            process.program.stop()
        self.agents.clear()
        self.controller = None


    def remove_workloads(self, timeout_s: float = 60) -> None:
        """Delete every AppWrapper left in the cluster and wait until they are gone: one
        left behind (a test that failed before its own delete) would be admitted onto
        the next test's new GPU nodes and hold their GPUs."""
        group, version, plural = APPWRAPPERS

        def left() -> list[tuple[str, str]]:
            try:
                listing = self.custom.list_cluster_custom_object(group, version, plural)
            except k8s.ApiException:  # a cluster without the AppWrapper kind
                return []
            return [(o["metadata"]["namespace"], o["metadata"]["name"])
                    for o in listing.get("items", [])]

        for namespace, name in left():
            with contextlib.suppress(k8s.ApiException):
                self.custom.delete_namespaced_custom_object(group, version, namespace,
                                                            plural, name)
        eventually(lambda: not left(), timeout_s, "the AppWrappers left behind deleted")

    def remove_nodes(self) -> None:
        """Delete the nodes add_nodes made, and the Pods bound to them at once, as the
        controller-manager's Pod GC would some 40 s later: a healthd controller
        replica scheduled onto a test's GPU node must not be killed during the next
        test (its leader's metrics would start again from zero)."""
        for name in self.nodes:
            with contextlib.suppress(k8s.ApiException):
                self.core.delete_node(name)
            for pod in self.core.list_pod_for_all_namespaces(
                    field_selector=f"spec.nodeName={name}").items:
                with contextlib.suppress(k8s.ApiException):
                    self.core.delete_namespaced_pod(pod.metadata.name, pod.metadata.namespace,
                                                    grace_period_seconds=0)
        self.nodes.clear()


@contextlib.contextmanager
def healthd_on(kubeconfig: Path, root: Path) -> Iterator[Healthd]:
    healthd = Healthd(kubeconfig, root)
    try:
        yield healthd
    finally:
        healthd.stop()
        healthd.remove_workloads()
        healthd.remove_nodes()
