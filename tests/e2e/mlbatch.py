"""The MLBatch tutorial's Kueue set-up and AppWrappers, as objects for the real cluster.

Teams `blue` and `red`, each with a ClusterQueue of its own and a LocalQueue
`default-queue`; `slack-cluster-queue` holds the spare GPUs; all three in
`default-cohort` on `default-flavor`. AppWrappers wrap a batch/v1 Job of GPU pods and
are created suspended with the queue label (the AppWrapper webhook would do both; the
operator runs without webhooks here), so Kueue admits them.
"""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes import watch

from healthd.demo.cluster import FLAVOR, SLACK_QUEUE, cluster_queue

SLACK = SLACK_QUEUE
LOCAL_QUEUE = "default-queue"
GPU = "nvidia.com/gpu"
KUEUE = ("kueue.x-k8s.io", "v1beta2")
APPWRAPPERS = ("workload.codeflare.dev", "v1beta2", "appwrappers")
Obj = dict[str, Any]


def tutorial(team_gpus: int = 8, slack_gpus: int = 16) -> list[Obj]:
    """Namespaces, the flavor, the three ClusterQueues and the teams' LocalQueues."""
    teams = ("blue", "red")
    return [
        *({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": t}} for t in teams),
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
         "metadata": {"name": FLAVOR}, "spec": {}},
        *(cluster_queue(f"{t}-cluster-queue", team_gpus, namespaces=[t]) for t in teams),
        cluster_queue(SLACK, slack_gpus),
        *({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
           "metadata": {"name": LOCAL_QUEUE, "namespace": t},
           "spec": {"clusterQueue": f"{t}-cluster-queue"}} for t in teams),
    ]


def appwrapper(name: str, namespace: str, *, pods: int, gpus_per_pod: int) -> Obj:
    """An AppWrapper of one Job of `pods` pods asking `gpus_per_pod` GPUs each."""
    container = {"name": "trainer", "image": "registry.example.com/trainer:latest",
                 "resources": {"requests": {GPU: str(gpus_per_pod)},
                               "limits": {GPU: str(gpus_per_pod)}}}
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
           "spec": {"parallelism": pods, "completions": pods, "backoffLimit": 0,
                    "template": {"spec": {"restartPolicy": "Never",
                                          "containers": [container]}}}}
    return {"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {"kueue.x-k8s.io/queue-name": LOCAL_QUEUE}},
            "spec": {"suspend": True, "components": [
                {"template": job,
                 "podSets": [{"replicas": pods, "path": "template.spec.template"}]}]}}


class Workloads:
    """What a user sees of AppWrappers, their pods and Kueue's decisions."""

    def __init__(self, client: k8s.ApiClient) -> None:
        self.custom = k8s.CustomObjectsApi(client)
        self.core = k8s.CoreV1Api(client)

    def appwrapper(self, namespace: str, name: str) -> Obj:
        group, version, plural = APPWRAPPERS
        return dict(self.custom.get_namespaced_custom_object(group, version, namespace,
                                                             plural, name))

    def phase(self, namespace: str, name: str) -> str:
        return str(self.appwrapper(namespace, name).get("status", {}).get("phase", ""))

    def pods(self, namespace: str, name: str) -> list[Any]:
        """The AppWrapper's pods that are not being deleted."""
        pods = self.core.list_namespaced_pod(
            namespace, label_selector=f"workload.codeflare.dev/appwrapper={name}").items
        return [p for p in pods if p.metadata.deletion_timestamp is None]

    def running_nodes(self, namespace: str, name: str) -> list[str]:
        return sorted(p.spec.node_name for p in self.pods(namespace, name)
                      if p.status.phase == "Running")

    def admitted(self, namespace: str, name: str) -> bool:
        """Kueue reserved quota for the AppWrapper's workload."""
        group, version = KUEUE
        workloads = self.custom.list_namespaced_custom_object(group, version, namespace,
                                                              "workloads")["items"]
        for workload in workloads:
            owners = workload["metadata"].get("ownerReferences") or []
            if any(o.get("kind") == "AppWrapper" and o.get("name") == name for o in owners):
                conditions = workload.get("status", {}).get("conditions") or []
                return any(c["type"] == "QuotaReserved" and c["status"] == "True"
                           for c in conditions)
        return False

    def lending_limit(self, queue: str = SLACK) -> str | None:
        group, version = KUEUE
        cq = self.custom.get_cluster_custom_object(group, version, "clusterqueues", queue)
        resource = cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]
        limit = resource.get("lendingLimit")
        return None if limit is None else str(limit)

    def held_back(self, namespace: str, name: str, for_s: float) -> bool:
        """The workload stays without quota for `for_s` seconds (Kueue is deciding)."""
        deadline = time.monotonic() + for_s
        while time.monotonic() < deadline:
            if self.admitted(namespace, name):
                return False
            time.sleep(0.5)
        return True


def documented_operator_autopilot() -> Obj:
    """The `appwrapper.autopilot` settings the docs tell an SRE to give the AppWrapper
    operator beside healthd (the first YAML block with `monitorNodes` in README.md or
    docs/): what the tests run the real operator with."""
    root = Path(__file__).resolve().parents[2]
    for page in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        for block in page.read_text().split("```yaml")[1:]:
            text = block.split("```")[0]
            if "monitorNodes" in text:
                return dict(yaml.safe_load(text)["appwrapper"]["autopilot"])
    raise AssertionError("no documented AppWrapper operator config (monitorNodes) found")


class PhaseRecorder:
    """Every phase an AppWrapper passes through, from a watch in a thread (a poll can
    miss a short Resetting)."""

    def __init__(self, client: k8s.ApiClient, namespace: str, name: str) -> None:
        self.phases: list[str] = []
        self.retries: list[int] = []
        self._watch = watch.Watch()
        self._thread = threading.Thread(target=self._run, args=(client, namespace, name),
                                        daemon=True)
        self._thread.start()

    def _run(self, client: k8s.ApiClient, namespace: str, name: str) -> None:
        group, version, plural = APPWRAPPERS
        custom = k8s.CustomObjectsApi(client)
        with contextlib.suppress(Exception):  # ends with stop(), or the test's end
            for event in self._watch.stream(custom.list_namespaced_custom_object, group,
                                            version, namespace, plural,
                                            field_selector=f"metadata.name={name}"):
                status = event["object"].get("status", {})
                phase = status.get("phase", "")
                if phase and (not self.phases or self.phases[-1] != phase):
                    self.phases.append(phase)
                self.retries.append(int(status.get("resettingCount", 0) or 0))

    def resets(self) -> int:
        return self.phases.count("Resetting")

    def stop(self) -> None:
        self._watch.stop()
