"""A small GPU cluster observed by a real Prometheus: the scenario every dashboard
query and alert expression is evaluated in.

- the API emulator holds 8 GPU nodes, a slack ClusterQueue (12 GPUs nominal) and two
  running AppWrappers on gpu-node-b;
- `healthd agent` runs (as processes, over a kubeconfig) on gpu-node-a, a simulated
  machine with a row remap pending, a slow PCIe link and a power brake (ERR), and on
  gpu-node-b, where NVML delivers an XID 79 on GPU 5 while the agent listens (EVICT,
  through its control file, as a real driver does: once, to whoever listens when it
  fires; so it fires again until the label shows it), and on gpu-node-h, healthy, whose
  Node writes the API refuses; a fourth agent target answers nothing (an agent that
  is down);
- `healthd controller` (beside a replica target that answers nothing) resets one
  AppWrapper and fails to reset the other (the API refuses its status write), lends
  0 of 12 GPUs with 16 unavailable (a shortfall), and, once two more nodes turn bad,
  opens its circuit breaker;
- the agents' pvc check probes a storage class that never binds and one that does
  not exist (UNKNOWN) and runs slower than its interval.
- the controller repairs (`controller.repair.enabled`): gpu-node-g is in hardware
  inspection, where an earlier repair left it.

Prometheus scrapes every second with dashboards/alerts.yaml loaded. The agents start
once the controller leads with its caches synced, so it watches gpu-node-b turn EVICT
(the label-to-reset latency is measured from that watch event). Each step waits for
what it needs, however long a loaded machine takes; only a generous guard against a
true hang (`HANG_S`) ends the wait, naming what was awaited.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from healthd.kube.conventions import Keys
from healthd.sim.apiserver import ThreadedEmulator
from healthd.sim.apiserver.emulator import ApiEmulator
from tests.observe.dashboards import DASHBOARDS

HERE = Path(__file__).resolve().parent
ALERTS = DASHBOARDS / "alerts.yaml"
AGENT_JOB = "healthd-agent-metrics"  # the metrics Services' names in deploy/
CONTROLLER_JOB = "healthd-controller-metrics"
KEYS = Keys()
GPU = "nvidia.com/gpu"
NS = "team-a"
QUEUE = "slack-cluster-queue"
REFUSED = "gpu-node-h"  # healthy, but the API refuses its agent's Node writes
XID_NODE = "gpu-node-b"  # NVML delivers it an XID 79 on GPU 5 at run time
AGENTS = {"gpu-node-a": str(HERE / "machines" / "gpu-node-a.yaml"),
          XID_NODE: "healthy-8xh100", REFUSED: "healthy-8xh100"}
XID_RETRY_S = 2.0  # an XID fired before the agent listened reaches no one: fire again
IDLE_NODES = tuple(f"gpu-node-{c}" for c in "cdefg")
DOOMED = "train-doomed"  # the AppWrapper whose reset the API refuses
DOOMED_STATUS = (rf"/apis/workload\.codeflare\.dev/v1beta2/namespaces/{NS}"
                 rf"/appwrappers/{DOOMED}/status")
CONFIG = {
    "agent": {"jitter": 0, "xid_window_s": 0.05, "api_timeout_s": 2},
    "checks": {
        **{name: {"interval": "1s"} for name in
           ("gpus", "remapped", "power", "pcie", "ecc", "nvlink", "xid")},
        "pciebw": {"interval": "2s"},
        "dcgm": {"interval": "2s"},
        "ping": {"enabled": False},
        # `fast` never binds (no provisioner), `missing` does not exist: UNKNOWN, and
        # each run outlasts the interval.
        "pvc": {"interval": "500ms", "params": {"storage_classes": ["fast", "missing"],
                                                 "bind_timeout_s": 3}},
    },
    # Long enough that no load makes the one controller lose its Lease: a new term
    # relists and resets without the label change's time, and the latency is never seen.
    "controller": {"election": {"lease_duration": "120s", "renew_deadline": "90s",
                                "retry_period": "1s"},
                   "repair": {"enabled": True}},
}
INSPECTED = "gpu-node-g"  # an earlier repair handed it to humans
OPT_OUT = "remediation.medik8s.io/exclude-from-remediation"
# Not a timing claim: a guard against a scenario that hangs (a process stuck, a fact
# that can never come about). A loaded machine takes longer, never this long.
HANG_S = 600.0


class ScenarioError(Exception):
    """The scenario did not come about; the message says what is missing."""


# -- the cluster -----------------------------------------------------------------------


def gpu_node(name: str, verdict: str | None = None) -> dict[str, Any]:
    capacity = {GPU: "8", "cpu": "64", "memory": "512Gi", "pods": "110"}
    labels = {KEYS.gpuhealth: verdict} if verdict else {}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "spec": {}, "status": {"capacity": capacity, "allocatable": capacity,
                                   "conditions": [{"type": "Ready", "status": "True"}]}}


def appwrapper(name: str, node: str) -> list[dict[str, Any]]:
    """A Running AppWrapper and its pod using one GPU on `node`."""
    wrapper = {"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper",
               "metadata": {"name": name, "namespace": NS},
               "spec": {"suspend": False, "components": []},
               "status": {"phase": "Running", "conditions": []}}
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": f"{name}-0", "namespace": NS,
                        "labels": {"workload.codeflare.dev/appwrapper": name}},
           "spec": {"nodeName": node, "containers": [
               {"name": "main", "image": "trainer",
                "resources": {"requests": {GPU: "1"}, "limits": {GPU: "1"}}}]},
           "status": {"phase": "Running"}}
    return [wrapper, pod]


def cluster() -> list[dict[str, Any]]:
    queue = {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ClusterQueue",
             "metadata": {"name": QUEUE},
             "spec": {"cohort": "default-cohort", "namespaceSelector": {}, "resourceGroups": [
                 {"coveredResources": [GPU], "flavors": [
                     {"name": "default-flavor",
                      "resources": [{"name": GPU, "nominalQuota": "12"}]}]}]}}
    flavor = {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ResourceFlavor",
              "metadata": {"name": "default-flavor"}, "spec": {}}
    storage = {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
               "metadata": {"name": "fast"}, "provisioner": "example.com/none"}
    inspected = gpu_node(INSPECTED, "EVICT")
    inspected["metadata"]["annotations"] = {KEYS.repair: json.dumps(
        {"state": "hardware-inspection", "since": "2026-01-01T00:00:00Z",
         "reason": "no repair clears these findings", "attempts": []})}
    # gpu-node-a keeps its pending remap on view: opted out of repairs, its GPUs are not
    # reset (a reset would have its agent let go of NVML, and the GPU series with it).
    nodes = [gpu_node(n) for n in AGENTS]
    nodes[0]["metadata"]["labels"][OPT_OUT] = "true"
    return [*nodes,
            *(gpu_node(n, "PASS") for n in IDLE_NODES if n != INSPECTED), inspected,
            *appwrapper("train-ok", "gpu-node-b"), *appwrapper(DOOMED, "gpu-node-b"),
            queue, flavor, storage]


def mark(api: ApiEmulator | ThreadedEmulator, node: str, verdict: str) -> None:
    """What another node's agent would do: relabel it."""
    stored = api.get("Node", node)
    stored["metadata"].setdefault("labels", {})[KEYS.gpuhealth] = verdict
    api.put(stored)


# -- Prometheus ------------------------------------------------------------------------


@dataclass
class Prometheus:
    """Prometheus' HTTP API, as dashboards and alerting use it."""

    url: str

    def _get(self, path: str, params: Iterable[tuple[str, str]] = ()) -> Any:
        query = urllib.parse.urlencode(list(params))
        try:
            with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=10) as resp:
                body = json.load(resp)
        except urllib.error.HTTPError as exc:  # a bad query: 400 with the reason
            with exc:
                body = json.load(exc)
        if body.get("status") != "success":
            raise ScenarioError(f"{path} {dict(params)}: {body.get('error', body)}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector (or scalar, as one sample) `expr` gives now."""
        data = self._get("/api/v1/query", [("query", expr)])
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        result: list[dict[str, Any]] = data["result"]
        return result

    def label_values(self, label: str, selector: str | None = None) -> list[str]:
        params = [("match[]", selector)] if selector else []
        return list(self._get(f"/api/v1/label/{label}/values", params))

    def alerts(self) -> dict[str, str]:
        """Alert name -> state (pending or firing) of the alerts active now."""
        out: dict[str, str] = {}
        for alert in self._get("/api/v1/alerts")["alerts"]:
            name = alert["labels"]["alertname"]
            out[name] = "firing" if "firing" in (out.get(name), alert["state"]) else alert["state"]
        return out

    def rule_names(self) -> list[str]:
        groups = self._get("/api/v1/rules")["groups"]
        return [rule["name"] for group in groups for rule in group["rules"]]

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False


def prometheus_config(agents: list[int], controllers: list[int]) -> dict[str, Any]:
    def job(name: str, ports: list[int]) -> dict[str, Any]:
        return {"job_name": name,
                "static_configs": [{"targets": [f"127.0.0.1:{p}" for p in ports]}]}

    return {"global": {"scrape_interval": "1s", "scrape_timeout": "900ms",
                       "evaluation_interval": "1s"},
            "rule_files": [str(ALERTS)],
            "scrape_configs": [job(AGENT_JOB, agents), job(CONTROLLER_JOB, controllers)]}


# -- processes -------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Processes:
    """Child processes with their output in `workdir`; all stopped on exit."""

    workdir: Path
    env: dict[str, str]
    running: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, name: str, argv: list[str], **env: str) -> None:
        with (self.workdir / f"{name}.log").open("wb") as log:
            self.running[name] = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**self.env, **env}, cwd=self.workdir)

    def check_alive(self) -> None:
        for name, proc in self.running.items():
            if proc.poll() is not None:
                raise ScenarioError(f"{name} exited with {proc.returncode}:\n{self.tail(name)}")

    def tail(self, name: str, lines: int = 15) -> str:
        path = self.workdir / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        for proc in self.running.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.running.values():
            try:
                proc.wait(timeout=12)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def child_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("KUBECONFIG", "NODE_NAME", "POD_NAME")}
    env["HOME"] = str(home)  # no ~/.kube/config to fall back on
    return env


HEALTHD = [sys.executable, "-m", "healthd.cli"]


# -- the scenario ----------------------------------------------------------------------

# What must be true (each query returns data) before the agents start: the controller
# leads with every cache synced.
CONTROLLER_READY = ("min(healthd_controller_cache_synced) == 1",)
# What must be true before the breaker is tripped, then after.
BEFORE_BREAKER = (
    'healthd_node_verdict{node="gpu-node-a", verdict="ERR"} == 1',
    'healthd_node_verdict{node="gpu-node-b", verdict="EVICT"} == 1',
    "healthd_gpu_pcie_bandwidth_gbps",
    "healthd_gpu_xid_events_total",
    'healthd_check_status{check="pvc", status="UNKNOWN"} == 1',
    'healthd_controller_resets_total{result="reset"} > 0',
    'increase(healthd_controller_resets_total{result="error"}[1m]) > 0',
    "healthd_controller_label_to_reset_seconds_count > 0",
    "healthd_agent_fault_to_label_seconds_count > 0",
    "healthd_controller_shortfall > 0",
    f'up{{job="{AGENT_JOB}"}} == 0',
    f'up{{job="{CONTROLLER_JOB}"}} == 0',
    f'healthd_agent_api_failing{{node="{REFUSED}"}} == 1',
)
AFTER_BREAKER = ("healthd_controller_breaker_open == 1",)


@dataclass
class Live:
    prometheus: Prometheus
    api: ThreadedEmulator
    processes: Processes


def wait_for(live: Live, step: str, exprs: Iterable[str], deadline: float) -> None:
    """Poll until every expression returns data. A process that exits fails at once;
    `deadline` (monotonic) only guards against a hang: ScenarioError naming the step,
    what it still awaited and the processes' last log lines."""
    awaited = list(exprs)
    missing = awaited
    while missing:
        live.processes.check_alive()
        missing = [e for e in missing if not live.prometheus.query(e)]
        if missing and time.monotonic() > deadline:
            logs = "\n".join(f"--- {name}\n{live.processes.tail(name)}"
                             for name in live.processes.running)
            raise ScenarioError(
                f"{step}: still awaiting {missing} (of {awaited}) after the {HANG_S:.0f} s "
                f"guard against a hang\n{logs}")
        time.sleep(0.25)


def fire_xid_until_shown(live: Live, control: Path, deadline: float) -> None:
    """Fire XID 79 on GPU 5 of XID_NODE through its control file until its label is
    EVICT (one fired before its agent listens reaches no one, as on a real node)."""
    shown = f'healthd_node_verdict{{node="{XID_NODE}", verdict="EVICT"}} == 1'
    line = json.dumps({"op": "emit_xid", "gpu": 5, "code": 79}) + "\n"
    while not live.prometheus.query(shown):
        live.processes.check_alive()
        if time.monotonic() > deadline:
            raise ScenarioError(f"XID 79 on {XID_NODE} not shown after the {HANG_S:.0f} s "
                                f"guard against a hang\n{live.processes.tail(XID_NODE)}")
        with control.open("a") as out:
            out.write(line)
        again = time.monotonic() + XID_RETRY_S
        while time.monotonic() < again and not live.prometheus.query(shown):
            time.sleep(0.25)


@contextmanager
def running_scenario(workdir: Path, prometheus_bin: str) -> Iterator[Live]:
    """Start everything, drive the scenario to its end state, stop everything on exit."""
    deadline = time.monotonic() + HANG_S
    with ExitStack() as stack:
        api = stack.enter_context(ApiEmulator.in_thread())
        api.seed(*cluster())
        api.fail("PATCH", DOOMED_STATUS, 403, times=1_000_000)
        api.fail("PATCH", rf"/api/v1/nodes/{REFUSED}(/status)?", 403, times=1_000_000)
        kubeconfig = str(api.write_kubeconfig(workdir / "kubeconfig"))
        config = workdir / "healthd.yaml"
        config.write_text(yaml.safe_dump(CONFIG))
        procs = Processes(workdir, child_env(workdir))
        stack.callback(procs.stop)
        agent_ports = {node: free_port() for node in AGENTS}
        controller_port, prom_port = free_port(), free_port()
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(prometheus_config(
            [*agent_ports.values(), free_port()],  # the last: an agent down
            [controller_port, free_port()])))  # and a controller replica down
        procs.start("prometheus", [
            prometheus_bin, f"--config.file={workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={workdir / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"])
        procs.start("controller", [*HEALTHD, "controller", "--kubeconfig", kubeconfig,
                                   "--config", str(config), "--http-port", str(controller_port)],
                    POD_NAME="healthd-controller-0")
        live = Live(Prometheus(f"http://127.0.0.1:{prom_port}"), api, procs)
        while not live.prometheus.ready():
            procs.check_alive()
            if time.monotonic() > deadline:
                raise ScenarioError(f"Prometheus not ready after the {HANG_S:.0f} s guard")
            time.sleep(0.1)
        wait_for(live, "the controller leading", CONTROLLER_READY, deadline)
        control = workdir / "xid-node.control.jsonl"
        for node, port in agent_ports.items():
            extra = ["--sim-control", str(control)] if node == XID_NODE else []
            procs.start(node, [*HEALTHD, "agent", "--kubeconfig", kubeconfig, "--config",
                               str(config), "--sim", AGENTS[node], "--node", node,
                               "--http-port", str(port), *extra])
        fire_xid_until_shown(live, control, deadline)
        wait_for(live, "the agents' faults and the controller's answers", BEFORE_BREAKER,
                 deadline)
        for node in IDLE_NODES[:2]:  # 4 of 8 GPU nodes bad: more than 30%
            mark(api, node, "ERR")
        wait_for(live, "the circuit breaker", AFTER_BREAKER, deadline)
        yield live
