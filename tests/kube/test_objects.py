"""The accessors read objects shaped as the API server sends them, and read a
half-filled or malformed object as empty instead of failing: a pod the scheduler has
not bound yet, a Node with no status, a field someone wrote with the wrong type."""

from __future__ import annotations

from typing import Any

from healthd.capacity.health import gpu_count, reasons_of
from healthd.controller.resets import counts
from healthd.kube.conventions import Keys, Verdict
from healthd.kube.objects import (
    container_statuses_of,
    is_cordoned,
    items_of,
    node_name_of,
    phase_of,
)
from healthd.kube.pods import pod_gpus
from healthd.kube.shapes import Node, Pod, view

# Trimmed from `kubectl get pod -o json`: quantities are strings, statuses carry more.
RUNNING_POD: dict[str, Any] = {
    "apiVersion": "v1", "kind": "Pod",
    "metadata": {"name": "train-0", "namespace": "team-a", "resourceVersion": "9041",
                 "labels": {"workload.codeflare.dev/appwrapper": "train"}},
    "spec": {
        "nodeName": "gpu-node-3",
        "initContainers": [{"name": "warmup",
                            "resources": {"limits": {"nvidia.com/gpu": "8"}}}],
        "containers": [{"name": "main", "resources": {
            "requests": {"cpu": "4", "nvidia.com/gpu": "2"},
            "limits": {"nvidia.com/gpu": "2"}}}],
    },
    "status": {"phase": "Running", "podIP": "10.0.3.7",
               "containerStatuses": [{"name": "main", "restartCount": 1, "ready": True}]},
}
PENDING_POD: dict[str, Any] = {  # created, not bound: no nodeName, no statuses
    "metadata": {"name": "train-1", "namespace": "team-a"},
    "spec": {"containers": [{"name": "main"}]},
    "status": {"phase": "Pending"},
}


def test_a_real_shaped_pod_reads_as_the_scheduler_and_the_operator_count_it() -> None:
    pod = view(Pod, RUNNING_POD)
    assert node_name_of(pod) == "gpu-node-3"
    assert phase_of(pod) == "Running"
    assert pod_gpus(pod) == 8  # the init container holds all 8 while it runs
    assert counts(pod)  # running regular containers ask for GPUs: a reset would count it
    assert [s.get("restartCount") for s in container_statuses_of(pod)] == [1]


def test_a_pod_missing_optional_fields_reads_as_empty() -> None:
    pod = view(Pod, PENDING_POD)
    assert node_name_of(pod) == ""
    assert pod_gpus(pod) == 0
    assert not counts(pod)
    assert container_statuses_of(pod) == []


def test_malformed_fields_read_as_empty_instead_of_failing() -> None:
    pod = view(Pod, {"metadata": None, "spec": {"containers": "main", "nodeName": None},
                     "status": ["Running"]})
    assert (node_name_of(pod), phase_of(pod), pod_gpus(pod)) == ("", "", 0)
    node = view(Node, {"spec": {"unschedulable": "yes", "taints": {"key": "x"}},
                       "status": None})
    assert not is_cordoned(node)  # only a real `true` cordons
    assert gpu_count(node, "nvidia.com/gpu") == 0
    assert reasons_of(node, keys=Keys(), bad_verdicts=frozenset(Verdict)) == frozenset()


def test_a_list_response_yields_its_objects_and_skips_what_is_not_one() -> None:
    listing = {"kind": "PodList", "items": [RUNNING_POD, "junk", PENDING_POD]}
    assert [node_name_of(p) for p in items_of(listing, Pod)] == ["gpu-node-3", ""]
    assert items_of({"kind": "Status"}, Pod) == []
