"""The GPU-reset Job: what the controller creates to reset GPUs in place on a node,
and how it reads the Job's end.

The Job runs `healthd gpu-reset -- UUID...` (healthd.repair.command) in the diagnostic
image, pinned to the node and requesting every GPU of it (healthd.kube.jobs): the
scheduler binds it only once no pod holds a GPU there, and keeps new work off the
GPUs while they are reset. Its name is deterministic (node and attempt number), so a
leader that dies between recording the attempt and creating the Job is followed by
one that creates the same Job, never a second one.

It is privileged and shares the node's process namespace (`hostPID`, so that
`healthd gpu-reset` can name the node's processes that still hold a GPU), unlike the
diagnostic Jobs: `nvidia-smi --gpu-reset` needs
CAP_SYS_ADMIN and every NVIDIA device node (/dev/nvidiactl and the other GPUs' too,
since the driver checks that no process holds any GPU in the reset's scope), which
the device plugin's per-GPU allocation does not give. So it runs in a namespace of
its own (`healthd-system-repair`, Pod Security `privileged`), where only the
controller may create Jobs; the agents have no rights there. It gets no API token.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from healthd.config import Config
from healthd.kube.conventions import Keys
from healthd.kube.jobs import (
    MAX_NAME,
    TERMINATION_LOG,
    PodPlacement,
    gpu_job,
    job_end,
    label_value,
    object_name,
)
from healthd.repair.report import reset_report

Obj = dict[str, Any]
SAID_CHARS = 300  # of what the message says per GPU


def job_name(node: str, attempt: int) -> str:
    """`healthd-gpu-reset-<node>-<attempt>`, the node part shortened to fit 63."""
    suffix = f"-{attempt}"
    head = object_name(f"healthd-gpu-reset-{node}", MAX_NAME - len(suffix))
    return head + suffix


def reset_command(uuids: Sequence[str]) -> list[str]:
    """The container's command: `--` before the UUIDs, so none is read as an option."""
    return ["healthd", "gpu-reset", "--termination-log", TERMINATION_LOG, "--", *uuids]


def reset_job(node: str, attempt: int, uuids: Sequence[str], gpu_count: int,
              config: Config) -> Obj:
    """The Job that resets `uuids` on `node` with all `gpu_count` GPUs reserved."""
    keys = Keys(config.label_prefix, config.own_prefix)
    diag, repair = config.agent.deep_diagnostics, config.controller.repair
    labels = {keys.gpu_reset: "true", keys.node: label_value(node)}
    container = {
        "name": "gpu-reset",
        "image": diag.image,
        "command": reset_command(uuids),
        # Privileged: see the module docstring (CAP_SYS_ADMIN, every device node).
        "securityContext": {"privileged": True},
    }
    metadata = {"name": job_name(node, attempt), "namespace": repair.namespace,
                "labels": labels, "annotations": {keys.node_name: node}}
    placement = PodPlacement(tolerations=diag.tolerations, priority_class=diag.priority_class,
                             runtime_class=diag.runtime_class)
    job = gpu_job(metadata=metadata, node=node, gpu_count=gpu_count, container=container,
                  placement=placement, pod_labels=labels, deadline_s=repair.reset_deadline)
    # The node's processes, so that what still holds a GPU (`/proc/*/fd`) can be named.
    job["spec"]["template"]["spec"]["hostPID"] = True
    return job


def _condition(job: Obj, kind: str) -> Obj | None:
    """The Job's condition `kind` when it is True (Jobs have no typed view here)."""
    conditions = job.get("status", {}).get("conditions") if isinstance(
        job.get("status"), dict) else None
    return next((c for c in conditions or [] if isinstance(c, dict)
                 and c.get("type") == kind and c.get("status") == "True"), None)


def job_outcome(job: Obj) -> str:
    """"succeeded", "failed" (its deadline passed, its pod failed), or "" while it runs."""
    return {"Complete": "succeeded", "Failed": "failed"}.get(job_end(job).partition(":")[0], "")


def failed_gpus(message: str) -> str:
    """What the pod's termination message (healthd gpu-reset's JSON, healthd.repair.
    report) says of the GPUs that were not reset, refused ones with what held them;
    "" when it says nothing readable."""
    report = reset_report(message)
    return "" if report is None else report.summary(SAID_CHARS)


def failure_of(job: Obj) -> str:
    """Why the Job failed, as its Failed condition says."""
    cond = _condition(job, "Failed") or {}
    return str(cond.get("message") or cond.get("reason") or "its pod failed")
