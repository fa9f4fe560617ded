"""The real control plane on loopback: etcd, kube-apiserver (RBAC + Node authorization,
service-account tokens, admission with ValidatingAdmissionPolicy and webhooks),
kube-controller-manager, kube-scheduler, kwok, Kueue and the AppWrapper operator.

`ControlPlane(root).start()` brings everything up in `root` (certificates, data,
logs, kubeconfigs) and waits until each part answers; `stop()` ends them all. Restarts
of single parts (`restart("kube-apiserver")`, `restart("etcd", wipe=True)`) and an etcd
backup put back (`backup_etcd`, `restore_etcd`) let tests try what a control plane does
to its clients.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.realcluster import addons, pki, programs
from tests.realcluster.processes import Program, StartError, free_port, http_ok

SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
START_S = 120.0  # a busy 2-core machine starts the API server in 10-40 s
# kwok keeps its nodes alive by rewriting their status every 20-45 s: each rewrite is a
# watch event for whoever watches the Node. A node annotated so is kept alive as a
# kubelet keeps its own: a Lease renewed every few seconds, the status reported every
# 5 minutes; nothing else writes the Node meanwhile.
KUBELET_HEARTBEAT = ("e2e.healthd.io/heartbeat", "lease")
NODE_LEASE_S = 40  # the kubelet's default nodeLeaseDurationSeconds
# The kubelet's nodeStatusReportFrequency (5 minutes): kwok's delay before each report,
# from and to (ms). A kubelet's phase is its start time; kwok draws each delay anew.
KUBELET_REPORT_MS = (300_000, 310_000)
# A pod so annotated is not run by kwok: whoever made it wrote its status (Running,
# Ready) itself, as a benchmark seeding tens of thousands of pods does.
STATUS_WRITTEN = ("e2e.healthd.io/status", "written")
# The parts that cache the API server's objects (besides healthd's own processes).
CACHING_COMPONENTS = ("kube-controller-manager", "kube-scheduler", "kwok", "kueue", "appwrapper")


def kubeconfig(server: str, ca: Path, *, user: dict[str, str], name: str = "realcluster") -> str:
    """A kubeconfig document for one identity (client certificate or token)."""
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": name,
        "clusters": [{"name": name, "cluster": {
            "server": server,
            "certificate-authority-data": base64.b64encode(ca.read_bytes()).decode()}}],
        "users": [{"name": name, "user": user}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}]})


@dataclass
class Ports:
    etcd: int = field(default_factory=free_port)
    etcd_peer: int = field(default_factory=free_port)
    apiserver: int = field(default_factory=free_port)
    kwok: int = field(default_factory=free_port)
    kueue_webhook: int = field(default_factory=free_port)
    kueue_health: int = field(default_factory=free_port)
    appwrapper_health: int = field(default_factory=free_port)


class ControlPlane:
    """One control plane in `root`. Not thread-safe; one per test session."""

    def __init__(self, root: Path, *, with_addons: bool = True, kwok_parallelism: int = 4,
                 kubelet_report_ms: tuple[int, int] = KUBELET_REPORT_MS,
                 node_lease_s: int = NODE_LEASE_S) -> None:
        self.root = root
        self.with_addons = with_addons
        # kwok's workers per kind (its default 4): at 5,000 nodes a busy server's
        # latency, not its CPU, bounds how fast 4 workers bring nodes up.
        self.kwok_parallelism = kwok_parallelism
        self.kubelet_report_ms = kubelet_report_ms
        self.node_lease_s = node_lease_s  # renewed every quarter of it, as a kubelet does
        self.ports = Ports()
        self.pki = root / "pki"
        self.logs = root / "logs"
        self.admin_kubeconfig = root / "admin.kubeconfig"
        self.programs: dict[str, Program] = {}
        self.appwrapper_config: dict[str, Any] = addons.appwrapper_config()

    # -- addresses and credentials ----------------------------------------------------

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports.apiserver}"

    @property
    def ca(self) -> Path:
        return self.pki / "ca.crt"

    def token_kubeconfig(self, path: Path, token: str) -> Path:
        path.write_text(kubeconfig(self.server, self.ca, user={"token": token}))
        return path

    # -- the programs -------------------------------------------------------------------

    def _program(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Program:
        program = Program(name, argv, self.logs / f"{name}.log", env or {})
        self.programs[name] = program
        return program

    def _etcd(self) -> Program:
        peer = f"http://127.0.0.1:{self.ports.etcd_peer}"
        client = f"http://127.0.0.1:{self.ports.etcd}"
        return self._program("etcd", [
            str(programs.build("etcd")), "--name", "default", "--data-dir", str(self.root / "etcd"),
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"default={peer}", "--unsafe-no-fsync", "--log-level", "warn"])

    def _apiserver(self) -> Program:
        p = self.pki
        return self._program("kube-apiserver", [
            str(programs.build("kube-apiserver")),
            f"--etcd-servers=http://127.0.0.1:{self.ports.etcd}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
            f"--secure-port={self.ports.apiserver}",
            f"--tls-cert-file={p / 'apiserver.crt'}",
            f"--tls-private-key-file={p / 'apiserver.key'}",
            f"--client-ca-file={p / 'ca.crt'}",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={p / 'sa.pub'}",
            f"--service-account-signing-key-file={p / 'sa.key'}",
            f"--api-audiences={SERVICE_ACCOUNT_ISSUER}",
            "--service-cluster-ip-range=10.96.0.0/16",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            "--allow-privileged=true", "--profiling=false", "--v=1"])

    def _component(self, name: str, *flags: str) -> Program:
        """A control-plane component that reaches the API server as the admin and
        serves its own health on a loopback port; no leader election (one of each)."""
        config = self.admin_kubeconfig
        return self._program(name, [
            str(programs.build(name)), f"--kubeconfig={config}",
            f"--authentication-kubeconfig={config}", f"--authorization-kubeconfig={config}",
            "--bind-address=127.0.0.1", f"--secure-port={free_port()}",
            "--leader-elect=false", "--v=1", *flags])

    def _controller_manager(self) -> Program:
        return self._component(
            "kube-controller-manager", "--controllers=*",
            f"--service-account-private-key-file={self.pki / 'sa.key'}",
            f"--root-ca-file={self.pki / 'ca.crt'}",
            "--use-service-account-credentials=false", "--concurrent-gc-syncs=5",
            # Nodes a test registers without kwok (the policy table's) are not marked
            # NotReady and tainted while the test writes them; kwok's nodes heartbeat.
            "--node-monitor-grace-period=10m", "--node-startup-grace-period=10m")

    def _scheduler(self) -> Program:
        return self._component("kube-scheduler")

    def _kwok(self) -> Program:
        return self._program("kwok", [
            str(programs.build("kwok")), f"--kubeconfig={self.admin_kubeconfig}",
            f"--config={self._kwok_stages()}",
            "--manage-all-nodes=false",
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
            f"--node-lease-duration-seconds={self.node_lease_s}",
            "--cidr=10.244.0.0/16", "--node-ip=10.0.0.1",
            f"--server-address=127.0.0.1:{self.ports.kwok}"])

    def _kwok_stages(self) -> Path:
        """kwok's own stages from its module: nodes become Ready and keep a heartbeat;
        pods become Running and Ready and go away when deleted. Not `pod-complete`:
        a training pod runs until something stops it."""
        stages = programs.module_dir("sigs.k8s.io/kwok",
                                     programs.pinned_version("kwok", "sigs.k8s.io/kwok"))
        stages = stages / "kustomize/stage"
        files = ["node/fast/node-initialize.yaml", "pod/fast/pod-delete.yaml"]
        docs = [(stages / f).read_text() for f in files]
        docs.append(yaml.safe_dump(_pod_ready(stages / "pod/fast/pod-ready.yaml")))
        docs += [yaml.safe_dump(stage)
                 for stage in _heartbeats(stages / "node", self.kubelet_report_ms)]
        docs.append(yaml.safe_dump(self._kwok_configuration()))
        path = self.root / "kwok-stages.yaml"
        path.write_text("\n---\n".join(docs))
        return path

    def _kwok_configuration(self) -> dict[str, Any]:
        workers = self.kwok_parallelism
        return {"apiVersion": "config.kwok.x-k8s.io/v1alpha1", "kind": "KwokConfiguration",
                "options": {"nodePlayStageParallelism": workers,
                            "podPlayStageParallelism": workers,
                            "nodeLeaseParallelism": workers}}

    # -- life cycle --------------------------------------------------------------------

    def start(self) -> ControlPlane:
        self.root.mkdir(parents=True, exist_ok=True)
        pki.make(self.pki)
        self.admin_kubeconfig.write_text(kubeconfig(self.server, self.ca, user={
            "client-certificate": str(self.pki / "admin.crt"),
            "client-key": str(self.pki / "admin.key")}))
        for make in (self._etcd, self._apiserver, self._controller_manager, self._scheduler,
                     self._kwok):
            self._start(make())
        if self.with_addons:
            addons.install(self)
        return self

    def _start(self, program: Program) -> None:
        program.start()
        self._wait_ready(program)

    def _wait_ready(self, program: Program) -> None:
        admin = (self.pki / "admin.crt", self.pki / "admin.key")
        probes = {
            "etcd": lambda: http_ok(f"http://127.0.0.1:{self.ports.etcd}/health"),
            "kube-apiserver": lambda: http_ok(f"{self.server}/readyz", ca=self.ca, cert=admin),
            "kwok": lambda: http_ok(f"http://127.0.0.1:{self.ports.kwok}/healthz"),
            "kueue": lambda: http_ok(f"http://127.0.0.1:{self.ports.kueue_health}/readyz"),
            "appwrapper": lambda: http_ok(f"http://127.0.0.1:{self.ports.appwrapper_health}/healthz"),
        }
        probe = probes.get(program.name)
        if probe is None:  # controller-manager, scheduler: alive after a moment is enough
            time.sleep(1.0)
            if not program.running():
                program.wait_until(lambda: False, 0, "start")
            return
        program.wait_until(probe, START_S, "readiness")

    def restart(self, name: str, *, wipe: bool = False, kill: bool = False) -> None:
        """Stop one program (SIGKILL with `kill`) and start it again; `wipe` (etcd only)
        starts it on an empty data directory, as after a restore to a fresh cluster."""
        program = self.programs[name]
        program.kill() if kill else program.stop()
        if wipe:
            shutil.rmtree(self.root / "etcd", ignore_errors=True)
        self._start(program)

    def compact_etcd(self) -> int:
        """Compact etcd to its current revision (what its periodic compaction does):
        a watch that resumes from an older resourceVersion then gets 410 Gone."""
        base = f"http://127.0.0.1:{self.ports.etcd}/v3/kv"
        key = base64.b64encode(b"/").decode()
        revision = int(_post(f"{base}/range", {"key": key, "limit": 1})["header"]["revision"])
        _post(f"{base}/compaction", {"revision": str(revision), "physical": True})
        return revision

    def backup_etcd(self, to: Path) -> Path:
        """A backup of etcd's data taken as an SRE can without etcdutl: the member
        stopped, its data directory copied to `to`, the member started again (the API
        server rides through, as through any etcd restart)."""
        etcd = self.programs["etcd"]
        etcd.stop()
        shutil.copytree(self.root / "etcd", to)
        self._start(etcd)
        return to

    def restore_etcd(self, backup: Path, *, restart: Sequence[str] = ()) -> float:
        """Put `backup` back: stop the API server and etcd, put the backup's data in
        place, start etcd and the API server; then restart the parts named in
        `restart` (the Kubernetes docs advise restarting what caches the API server's
        objects, e.g. `CACHING_COMPONENTS`). What is not restarted keeps running
        through it, as healthd's agents and controller do, and must notice the
        change itself. Returns when (time.monotonic()) the API server answered again."""
        apiserver, etcd = self.programs["kube-apiserver"], self.programs["etcd"]
        apiserver.stop()
        etcd.stop()
        shutil.rmtree(self.root / "etcd")
        shutil.copytree(backup, self.root / "etcd")
        self._start(etcd)
        self._start(apiserver)
        back = time.monotonic()
        for name in restart:
            self.restart(name)
        return back

    def stop_program(self, name: str) -> None:
        self.programs[name].stop()

    def start_program(self, name: str) -> None:
        self._start(self.programs[name])

    def stop(self) -> None:
        for program in reversed(list(self.programs.values())):
            program.stop()

    def pids(self) -> dict[str, int]:
        return {name: p.pid for name, p in self.programs.items() if p.pid is not None}

    def state(self) -> dict[str, Any]:
        """What `python -m tests.realcluster down` needs to stop a by-hand cluster."""
        return {"root": str(self.root), "pids": self.pids(), "server": self.server,
                "kubeconfig": str(self.admin_kubeconfig)}

    def save_state(self) -> Path:
        path = self.root / "state.json"
        path.write_text(json.dumps(self.state(), indent=2))
        return path


def _pod_ready(stage_file: Path) -> dict[str, Any]:
    """kwok's pod-ready stage, for every pod but those whose status was written for
    them (STATUS_WRITTEN)."""
    stage: dict[str, Any] = yaml.safe_load(stage_file.read_text())
    key, value = STATUS_WRITTEN
    stage["spec"]["selector"]["matchExpressions"].append(
        {"key": f'.metadata.annotations["{key}"]', "operator": "NotIn", "values": [value]})
    return stage


def _heartbeats(stages: Path, report_ms: tuple[int, int]) -> list[dict[str, Any]]:
    """kwok's two node heartbeat stages, each for its nodes (see KUBELET_HEARTBEAT):
    the status rewritten every 20-45 s, or a Lease renewed and the status reported
    every `report_ms` (from, to), as a kubelet does (every 5 minutes, its
    nodeStatusReportFrequency)."""
    key, value = KUBELET_HEARTBEAT
    selected = {"key": f'.metadata.annotations["{key}"]', "values": [value]}
    status = yaml.safe_load((stages / "heartbeat/node-heartbeat.yaml").read_text())
    status["spec"]["selector"]["matchExpressions"].append({**selected, "operator": "NotIn"})
    lease = yaml.safe_load(
        (stages / "heartbeat-with-lease/node-heartbeat-with-lease.yaml").read_text())
    lease["spec"]["selector"]["matchExpressions"].append({**selected, "operator": "In"})
    lease["spec"]["delay"] = {"durationMilliseconds": report_ms[0],
                              "jitterDurationMilliseconds": report_ms[1]}
    return [status, lease]


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return dict(json.loads(response.read()))


def stop_saved(state_file: Path) -> list[str]:
    """Stop what a saved state names (a by-hand `up`); the names of what was stopped."""
    state = json.loads(state_file.read_text())
    stopped = []
    for name, pid in reversed(list(state["pids"].items())):
        try:
            os.killpg(pid, signal.SIGTERM)
            stopped.append(name)
        except ProcessLookupError:
            continue
    deadline = time.monotonic() + 10
    for pid in state["pids"].values():
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.2)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
    return stopped


__all__ = ["ControlPlane", "StartError", "kubeconfig", "stop_saved"]
