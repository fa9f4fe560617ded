"""The AppWrapper operator stand-in's placement: the health affinity it injects keeps
pods off ERR/TESTING/EVICT nodes, cordons and used GPUs are respected, and a job
that does not fit is not placed at all."""

from __future__ import annotations

from typing import Any

from healthd.demo.cluster import appwrapper_object, node_object
from healthd.demo.scenario import AppWrapperSpec
from healthd.kube.conventions import Keys
from healthd.sim.appwrapper_operator import place, pod_specs_of

KEYS = Keys()
MODEL = "NVIDIA H100 80GB HBM3"


def node(name: str, verdict: str = "PASS", *, cordoned: bool = False) -> dict[str, Any]:
    obj = node_object(name, 8, MODEL)
    obj["metadata"]["labels"][KEYS.gpuhealth] = verdict
    obj["spec"]["unschedulable"] = cordoned
    return obj


def specs(pods: int, gpus: int) -> list[dict[str, Any]]:
    aw = appwrapper_object(AppWrapperSpec(name="job", pods=pods, gpus_per_pod=gpus))
    return pod_specs_of(aw, KEYS)


def running_pod(where: str, gpus: int) -> dict[str, Any]:
    return {"spec": {"nodeName": where, "containers": [
        {"resources": {"requests": {"nvidia.com/gpu": str(gpus)}}}]},
        "status": {"phase": "Running"}}


def test_every_replica_gets_the_health_affinity() -> None:
    pods = specs(3, 8)
    assert len(pods) == 3
    expr = pods[0]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"][0]["matchExpressions"][0]
    assert expr == {"key": KEYS.gpuhealth, "operator": "NotIn",
                    "values": ["ERR", "TESTING", "EVICT"]}


def test_unhealthy_and_cordoned_nodes_are_skipped() -> None:
    nodes = [node("a", "EVICT"), node("b", "ERR"), node("c", "TESTING"),
             node("d", cordoned=True), node("e", "WARN"), node("f")]
    assert place(specs(2, 8), nodes, []) == ["e", "f"]


def test_gpus_in_use_count_and_a_job_that_does_not_fit_waits() -> None:
    nodes = [node("a"), node("b")]
    used = [running_pod("a", 4), running_pod("b", 8)]
    assert place(specs(1, 4), nodes, used) == ["a"]
    assert place(specs(2, 4), nodes, used) is None
    finished = {**running_pod("b", 8), "status": {"phase": "Succeeded"}}
    assert place(specs(2, 4), nodes, [used[0], finished]) == ["a", "b"]
