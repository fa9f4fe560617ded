"""healthd's Pods run as a kubelet runs their containers, so that whatever replaces the
Pods replaces the processes too.

`Kubelet` keeps one process for every Running Pod of the agent DaemonSet (on the nodes
it simulates, one `Machine` each) and of the controller Deployment: started when the
Pod runs, with a token bound to that Pod and the config that Pod mounts, and stopped
with SIGTERM when the Pod is deleted. `kubectl rollout restart` or a `helm upgrade`
that changes the config therefore gives every agent a new process, a new Pod and a new
token, as on a cluster. Like a real kubelet it keeps a deleted Pod until its process
has stopped (a finalizer of its own; kwok would remove the Pod at once), so what an
agent writes while it shuts down is written with a token that is still valid.

It also plays the controller's GPU-reset Jobs on its machines, as a node's kubelet
runs their one container: once the real Job controller and scheduler have bound the
Job's pod to a simulated node and kwok has marked it Running (kwok never completes a
pod), the pod's own command (`healthd gpu-reset UUID...`) runs here, on that node's
`Machine` (healthd.sim.kubelet.HealthdRunner: the simulated nvidia-smi resets the GPU
the node's agent sees), and the pod's status says how it ended: Succeeded or Failed
with the container's termination message, from which the real Job controller
completes or fails the Job. `resets_allowed` cleared holds them Running until set.

A `Machine` outlives the processes on it, as a node outlives its agent Pods: its
clock, its kernel log and the agent's position in it, its RDMA ports. An NVML event
reaches only the process running when it happens: the real NVML delivers it once, to
whoever listens then.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import yaml
from kubernetes import client as k8s
from prometheus_client.parser import text_string_to_metric_families

from healthd.config.controller import DEFAULT_REPAIR_NAMESPACE
from healthd.kube.conventions import Keys
from healthd.sim.control import APPLIED_S
from healthd.sim.kernellog import SimKernelLog
from healthd.sim.kubelet import HealthdRunner, terminated_status
from healthd.sim.machine import MachineSpec
from healthd.sim.shared import SUFFIX
from tests.e2e.healthd import HEALTHD, NAMESPACE, Healthd, eventually, merge
from tests.realcluster.processes import Program, free_port, http_ok, log_tail

Obj = dict[str, Any]
FINALIZER = "e2e.healthd.io/container-running"  # the Pod's process has not stopped yet
SYNC_S = 0.3  # how often the Pods are looked at
GPU_RESETS = f"{Keys().gpu_reset}=true"  # the controller's GPU-reset Jobs' pods
# kwok 0.8 drops a Pod bound to a node in the moment after it took the node's Lease
# (the Pod's event is judged against its Lease cache, which has no Lease yet, and
# nothing looks again): the DaemonSet's Pod on a new node then stays Pending. Any
# change to the Pod makes kwok look again; one is made after NUDGE_S of Pending.
NUDGE_S = 3.0
NUDGED = "e2e.healthd.io/kwok-look-again"


class Machine:
    """The simulated GPU node `node` (see the module docstring), its files in `root`.
    Every agent process on it is started with one control file, which names one
    machine across processes (healthd.sim.shared): its clock, its kernel log and the
    agent's position in it, its RDMA ports. A change written to the control file
    reaches the process running now; a later process finds the machine as it was
    left, and an XID that fired before it listened never reaches it."""

    def __init__(self, node: str, spec: MachineSpec, root: Path) -> None:
        self.node, self.spec = node, spec
        root.mkdir(parents=True, exist_ok=True)
        self.spec_file = root / "machine.yaml"
        self.spec_file.write_text(yaml.safe_dump(spec.model_dump(mode="json",
                                                                 exclude_defaults=True)))
        self.control = root / "control.jsonl"
        self.control.touch()
        self._files = self.control.with_name(self.control.name + SUFFIX)

    def _command(self, **command: Any) -> None:
        with open(self.control, "a") as handle:
            handle.write(json.dumps(command) + "\n")

    def emit_xid(self, gpu: int, code: int) -> None:
        """An XID that NVML reports now, to the agent process listening now."""
        self._command(op="emit_xid", gpu=gpu, code=code)

    def rdma_port(self, device: str, **changes: Any) -> None:
        """An RDMA port that shows `changes` from now on (a cable pulled, ...)."""
        self._command(op="rdma_port", device=device, **changes)

    def inject(self, **fault: Any) -> None:
        """A GPU fault the machine shows from now on (healthd.sim.machine.GpuFault)."""
        self._command(op="inject", fault=fault)

    def resets(self) -> list[int]:
        """The GPUs reset on this machine so far, in order (each reset is a line the
        simulated nvidia-smi appends to the control file)."""
        lines = [json.loads(line) for line in self.control.read_text().splitlines()
                 if line.strip()]
        return [int(c["gpu"]) for c in lines if c.get("op") == "gpu_reset"]

    def log(self, message: str) -> None:
        """A line the driver writes to the machine's kernel log now (after the
        lines already there, dated by the machine's clock)."""
        started = float((self._files / "started").read_text())
        SimKernelLog(self._files / "kmsg",
                     lambda: self.spec.uptime_s + time.time() - started).append(message)


@dataclass
class Container:
    """The process of one healthd Pod."""

    pod: Obj
    program: Program
    port: int  # its HTTP port: /readyz, /metrics

    @property
    def uid(self) -> str:
        return str(self.pod["metadata"]["uid"])

    @property
    def node(self) -> str:
        return str(self.pod["spec"].get("nodeName", ""))

    @property
    def is_agent(self) -> bool:
        return _is_agent(self.pod)

    def ready(self) -> bool:
        return http_ok(f"http://127.0.0.1:{self.port}/readyz")

    def metrics(self) -> str:
        """Its /metrics page; "" while the process does not answer."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics",
                                        timeout=5) as answer:
                return str(answer.read().decode())
        except OSError:
            return ""

    def sample(self, name: str, **labels: str) -> float:
        """The value of metric sample `name` with (at least) `labels`, summed; 0 when
        there is none."""
        return sum(s.value for family in text_string_to_metric_families(self.metrics())
                   for s in family.samples
                   if s.name == name and labels.items() <= s.labels.items())

    def runs(self) -> dict[str, float]:
        """Completed runs per check (healthd_check_runs_total, every result); none
        while the process does not answer."""
        out: dict[str, float] = {}
        for line in self.metrics().splitlines():
            if line.startswith("healthd_check_runs_total{"):
                labels, _, value = line.rpartition(" ")
                check = labels.split('check="', 1)[1].split('"', 1)[0]
                out[check] = out.get(check, 0.0) + float(value)
        return out


@dataclass
class Kubelet:
    """See the module docstring. `config` goes over the config each Pod mounts (the
    test's short clocks)."""

    healthd: Healthd
    machines: dict[str, Machine]
    root: Path
    config: Obj = field(default_factory=dict)
    containers: dict[str, Container] = field(default_factory=dict)  # by Pod uid
    resets_played: list[str] = field(default_factory=list)  # GPU-reset pods run, by name

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.resets_allowed = threading.Event()
        self.resets_allowed.set()
        self._lock = threading.Lock()
        self._stopping: dict[str, threading.Thread] = {}
        self._pending: dict[str, float] = {}  # Pod uid -> when last seen Pending, or nudged
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kubelet", daemon=True)
        self.errors: list[str] = []

    def __enter__(self) -> Kubelet:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join(30)
        with self._lock:
            stopping = list(self._stopping.values())
        for thread in stopping:
            thread.join(30)
        for uid in list(self.containers):
            self._stop(uid)
        for pod in self._pods():  # held, but its process never started
            if FINALIZER in _finalizers(pod):
                self._release(pod)

    # -- what runs ------------------------------------------------------------------

    def agents(self) -> dict[str, Container]:
        """node -> the agent process running there now."""
        with self._lock:
            return {c.node: c for c in self.containers.values()
                    if c.is_agent and c.uid not in self._stopping}

    def agent(self, node: str) -> Container:
        found: Container = eventually(lambda: self.agents().get(node), 90,
                                      f"an agent running on {node}")
        return found

    def controllers(self) -> list[Container]:
        with self._lock:
            return [c for c in self.containers.values()
                    if not c.is_agent and c.uid not in self._stopping]

    # -- the loop -------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._done.wait(SYNC_S):
            try:
                self._sync()
            except Exception as exc:  # the API server restarting: try again
                self.errors.append(repr(exc))

    def _pods(self) -> list[Obj]:
        return [self.healthd.client.sanitize_for_serialization(p) for p in
                self.healthd.core.list_namespaced_pod(NAMESPACE).items]

    def _sync(self) -> None:
        seen = set()
        for pod in self._pods():
            if not self._ours(pod):
                continue
            uid = pod["metadata"]["uid"]
            seen.add(uid)
            deleted = pod["metadata"].get("deletionTimestamp") is not None
            if deleted:
                if uid in self.containers:
                    self._stop_soon(uid)
                elif uid not in self._stopping and FINALIZER in _finalizers(pod):
                    self._release(pod)
            elif pod["status"].get("phase") == "Running" and uid not in self.containers:
                self._start(pod)
            elif pod["status"].get("phase") == "Pending" and pod["spec"].get("nodeName"):
                self._nudge_if_stuck(pod)
        with self._lock:
            gone = set(self.containers) - seen
        for uid in gone:  # the Pod is gone
            self._stop_soon(uid)
        self._play_gpu_resets()

    def _nudge_if_stuck(self, pod: Obj) -> None:
        """Make kwok look again at a bound Pod Pending for NUDGE_S (see NUDGE_S)."""
        meta, now = pod["metadata"], time.monotonic()
        since = self._pending.setdefault(meta["uid"], now)
        if now - since < NUDGE_S:
            return
        self._pending[meta["uid"]] = now
        self.healthd.core.patch_namespaced_pod(meta["name"], NAMESPACE, {
            "metadata": {"annotations": {NUDGED: str(int(time.time()))}}})

    def _ours(self, pod: Obj) -> bool:
        if _is_agent(pod):
            return pod["spec"].get("nodeName") in self.machines
        return _name(pod) == "healthd-controller"

    # -- GPU-reset Jobs -----------------------------------------------------------------

    def _play_gpu_resets(self) -> None:
        """Start each new GPU-reset pod that runs on one of the machines."""
        for found in self.healthd.core.list_namespaced_pod(DEFAULT_REPAIR_NAMESPACE,
                                                           label_selector=GPU_RESETS).items:
            pod = self.healthd.client.sanitize_for_serialization(found)
            if self._claim(pod):
                threading.Thread(target=self._play_gpu_reset, name="gpu-reset",
                                 args=(pod, self.machines[pod["spec"]["nodeName"]]),
                                 daemon=True).start()

    def _claim(self, pod: Obj) -> bool:
        """Whether `pod` is a GPU-reset pod to run now (Running on one of the machines,
        not run yet); it is then taken."""
        meta = pod["metadata"]
        due = (pod["spec"].get("nodeName") in self.machines
               and pod["status"].get("phase") == "Running"
               and meta.get("deletionTimestamp") is None)
        with self._lock:
            if not due or meta["name"] in self.resets_played:
                return False
            self.resets_played.append(meta["name"])
            return True

    def _play_gpu_reset(self, pod: Obj, machine: Machine) -> None:
        """Run the pod's container on `machine`, then report how it ended."""
        while not self.resets_allowed.wait(SYNC_S):
            if self._done.is_set():
                return
        name = pod["metadata"]["name"]
        try:
            ended = anyio.run(HealthdRunner(machine.spec_file, control=machine.control), pod)
            # On a node every process sees a reset GPU at once; here the agent follows
            # the machine's control file: it has the reset before the pod is reported.
            time.sleep(APPLIED_S)
            status = terminated_status(pod, ended, reason="Completed" if ended.exit_code == 0
                                       else "Error")
            self.healthd.core.patch_namespaced_pod_status(name, DEFAULT_REPAIR_NAMESPACE,
                                                          {"status": status})
        except Exception as exc:  # not reported: the Job's deadline fails it
            self.errors.append(f"GPU reset {name}: {exc!r}")

    # -- starting and stopping --------------------------------------------------------

    def _start(self, pod: Obj) -> None:
        meta = pod["metadata"]
        self._hold(pod)
        node = pod["spec"].get("nodeName", "")
        machine = self.machines[node] if _is_agent(pod) else None
        port = free_port()
        token = self.healthd.token_for(pod, pod["spec"]["serviceAccountName"])
        kubeconfig = self.healthd.token_kubeconfig(token, self.root / f"{meta['name']}.kubeconfig")
        config = self._config_file(pod)
        common = ["--kubeconfig", str(kubeconfig), "--config", str(config),
                  "--http-port", str(port)]
        env = {"POD_NAME": meta["name"], "POD_NAMESPACE": NAMESPACE}
        if machine is not None:
            argv = [*HEALTHD, "agent", "--sim", str(machine.spec_file),
                    "--sim-control", str(machine.control), *common]
            env["NODE_NAME"] = node
        else:
            argv = [*HEALTHD, "controller", *common]
        program = Program(meta["name"], argv, self.root / f"{meta['name']}.log", env)
        program.start()
        with self._lock:
            self.containers[meta["uid"]] = Container(pod, program, port)

    def _config_file(self, pod: Obj) -> Path:
        """The config the Pod mounts (its ConfigMap, as the cluster has it now), with
        the kubelet's `config` over it."""
        (volume,) = [v for v in pod["spec"].get("volumes", []) if "configMap" in v]
        configmap = self.healthd.core.read_namespaced_config_map(
            volume["configMap"]["name"], NAMESPACE)
        (text,) = (configmap.data or {}).values()
        mounted = yaml.safe_load(text) or {}
        path = self.root / f"{pod['metadata']['name']}.config.yaml"
        path.write_text(yaml.safe_dump(merge(mounted, self.config)))
        return path

    def _stop_soon(self, uid: str) -> None:
        """SIGTERM now, the grace period to stop, then the Pod may go (a thread: each
        node's kubelet stops its own containers, side by side)."""
        with self._lock:
            if uid in self._stopping:
                return
            thread = threading.Thread(target=self._stop, args=(uid,), daemon=True)
            self._stopping[uid] = thread
        thread.start()

    def _stop(self, uid: str) -> None:
        container = self.containers[uid]
        grace = float(container.pod["spec"].get("terminationGracePeriodSeconds") or 30)
        container.program.stop(grace_s=grace)
        with contextlib.suppress(k8s.ApiException):
            self._release(container.pod)
        with self._lock:
            self.containers.pop(uid, None)
            self._stopping.pop(uid, None)

    def _hold(self, pod: Obj) -> None:
        """The finalizer that keeps a deleted Pod until its process has stopped."""
        meta = pod["metadata"]
        if FINALIZER in _finalizers(pod):
            return
        patch: list[Obj] = ([{"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER}]
                            if meta.get("finalizers") else
                            [{"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]}])
        self.healthd.core.patch_namespaced_pod(meta["name"], NAMESPACE, patch)

    def _release(self, pod: Obj) -> None:
        meta = pod["metadata"]
        for _ in range(5):
            try:
                current = self.healthd.core.read_namespaced_pod(meta["name"], NAMESPACE)
            except k8s.ApiException as exc:
                if exc.status == 404:
                    return
                raise
            finalizers = current.metadata.finalizers or []
            if FINALIZER not in finalizers:
                return
            index = finalizers.index(FINALIZER)
            try:
                self.healthd.core.patch_namespaced_pod(meta["name"], NAMESPACE, [
                    {"op": "test", "path": f"/metadata/finalizers/{index}", "value": FINALIZER},
                    {"op": "remove", "path": f"/metadata/finalizers/{index}"}])
                return
            except k8s.ApiException as exc:
                if exc.status not in (409, 422):
                    raise


def _name(pod: Obj) -> str | None:
    return (pod["metadata"].get("labels") or {}).get("app.kubernetes.io/name")


def _is_agent(pod: Obj) -> bool:
    return _name(pod) == "healthd-agent"


def _finalizers(pod: Obj) -> list[str]:
    return list(pod["metadata"].get("finalizers") or [])


def agents_replaced(kubelet: Kubelet, before: dict[str, Container],
                    checks: Iterable[str], runs: int, timeout_s: float) -> dict[str, Container]:
    """Wait until every node in `before` runs a new agent process (another Pod) that is
    ready and has completed `runs` runs of each of `checks` (its first rounds are
    behind it); the new processes by node."""
    checks = tuple(checks)

    def settled() -> dict[str, Container] | None:
        now = kubelet.agents()
        fresh = {node: c for node, c in now.items() if c.uid != before[node].uid}
        for node, container in fresh.items():
            if not container.program.running():  # a kubelet would restart it: no point
                raise AssertionError(f"the new agent on {node} exited:\n"
                                     f"{log_tail(container.program.log, 2000)}")
        if set(fresh) != set(before):
            return None
        for container in fresh.values():
            if not container.ready():
                return None
            done = container.runs()
            if any(done.get(check, 0) < runs for check in checks):
                return None
        return fresh
    try:
        fresh: dict[str, Container] = eventually(
            settled, timeout_s, f"a new, settled agent on each of {len(before)} nodes",
            poll_s=1.0)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the kubelet's last errors: {kubelet.errors[-3:]}") from None
    return fresh
