"""Jobs pinned to one node that hold all its GPUs: the shape the agent's deep
diagnostics and the controller's GPU resets share.

Pinning uses node affinity (`matchFields metadata.name In [node]`), never
`spec.nodeName`, which would bypass the scheduler and its GPU accounting: the pod
requests (and limits) every GPU of the node, so the scheduler binds it only once no
other pod holds one, and nothing else lands there while it runs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from healthd.kube.conventions import GPU_RESOURCE

Obj = dict[str, Any]  # a Kubernetes object as JSON

TERMINATION_LOG = "/dev/termination-log"
TTL_AFTER_FINISHED_S = 600  # the cluster cleans up if its creator never deletes it
MAX_NAME = 63  # Job names feed the pods' job-name label, which is capped at 63


@dataclass(frozen=True)
class PodPlacement:
    """Where and how a node's Job pod runs, besides its container."""

    tolerations: Sequence[Mapping[str, Any]] = ()
    priority_class: str | None = None
    runtime_class: str | None = None  # the GPU Operator's `nvidia` runtime shows it the GPUs
    service_account: str | None = None
    security: Mapping[str, Any] = field(default_factory=dict)  # the pod's securityContext


def label_value(text: str) -> str:
    """`text` made a valid label value (63 chars, alphanumeric at both ends)."""
    cleaned = re.sub(r"[^A-Za-z0-9_.-]", "-", text)[:MAX_NAME]
    return cleaned.strip("-_.")


def object_name(text: str, limit: int = MAX_NAME) -> str:
    """`text` made a DNS-1123 label of at most `limit` characters."""
    name = re.sub(r"[^a-z0-9-]", "-", text.lower())[:limit]
    return name.strip("-")


def node_affinity(node: str) -> Obj:
    """Required node affinity on `node`'s name (the scheduler still accounts GPUs)."""
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [node]}]}]}}}


def gpu_job(*, metadata: Obj, node: str, gpu_count: int, container: Obj,
            placement: PodPlacement, pod_labels: Mapping[str, str],
            deadline_s: float) -> Obj:
    """A Job running `container` once on `node` with all `gpu_count` GPUs reserved;
    no retry, no API token, killed after `deadline_s`, cleaned up by TTL."""
    gpus = {GPU_RESOURCE: str(gpu_count)}
    pod_spec: Obj = {
        "restartPolicy": "Never",
        "affinity": node_affinity(node),
        "tolerations": [dict(t) for t in placement.tolerations],
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": dict(placement.security),
        "containers": [{
            **container,
            "resources": {"requests": dict(gpus), "limits": dict(gpus)},
            "terminationMessagePath": TERMINATION_LOG,
            "terminationMessagePolicy": "FallbackToLogsOnError",
        }],
    }
    if placement.priority_class:
        pod_spec["priorityClassName"] = placement.priority_class
    if placement.runtime_class:
        pod_spec["runtimeClassName"] = placement.runtime_class
    if placement.service_account:
        pod_spec["serviceAccountName"] = placement.service_account
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata,
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": int(deadline_s),
            "ttlSecondsAfterFinished": TTL_AFTER_FINISHED_S,
            "template": {"metadata": {"labels": dict(pod_labels)}, "spec": pod_spec},
        },
    }


def job_end(job: Mapping[str, Any]) -> str:
    """How a Job ended, as its True `Complete` or `Failed` condition says
    (`Failed: BackoffLimitExceeded`); "" while it runs."""
    status = job.get("status")
    conditions = status.get("conditions") if isinstance(status, dict) else None
    for cond in conditions if isinstance(conditions, list) else ():
        if (isinstance(cond, dict) and cond.get("type") in ("Complete", "Failed")
                and cond.get("status") == "True"):
            why = cond.get("reason") or cond.get("message")
            return f"{cond['type']}: {why}" if why else str(cond["type"])
    return ""
