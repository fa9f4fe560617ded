"""The `pvc` check: can this node's storage classes still provision a volume?

For each configured storage class the check creates a tiny PVC, watches it until it is
`Bound` (or a deadline passes), and deletes it again. It is the storage counterpart of
the GPU checks: a CSI driver that stopped provisioning shows up here before a job does.

What it reports, per storage class (`Entity("storage", <class>)`):

- Bound in time -> PASS with `bind_s`, the seconds from create to Bound.
- Not bound in time -> `PVC_NOT_BOUND`; when the provisioner posted a
  `ProvisioningFailed` Event on the PVC, `PVC_PROVISION_ERROR` with its message
  instead. Provisioners retry, so an error event is judged only at the deadline: a
  transient error followed by a bind is a PASS, not a flap.
- Storage class not found -> UNKNOWN "storage class X not found". It is a config error
  about this check, not evidence about the node, so it must not raise the verdict.
- `volumeBindingMode: WaitForFirstConsumer` -> nothing binds until a pod uses the PVC:
  with `allow_pods` a short-lived pause pod pinned to this node mounts it; without,
  SKIPPED. The pod is pinned by node affinity on `metadata.name`, not `spec.nodeName`:
  a pod with `nodeName` bypasses the scheduler, which is what picks the node for a
  WaitForFirstConsumer volume, so its PVC would stay Pending forever.
- `reclaimPolicy: Retain` -> SKIPPED: every run would leave a volume behind.
- Any API failure (403, 5xx, unreachable) -> UNKNOWN with a one-line reason.
- No storage class configured -> SKIPPED.

Every object is labelled as this node's probe (the labels are healthd's: see
healthd.kube.pvc_probe, which implements the check's `ProbeApi`) and is deleted
when the probe ends, whatever ends it (bind, deadline, error, cancellation),
by a shielded cleanup with its own deadline. Each run starts by deleting what earlier
runs on this node left behind (an agent killed mid-probe), found by those labels.

RBAC needed in the probe namespace: persistentvolumeclaims and pods (create, get,
list, watch, delete), events (list); cluster-wide: storageclasses (get).
"""

from __future__ import annotations

import logging
import re
import secrets
from dataclasses import dataclass, replace
from typing import Annotated, Any, ClassVar

import anyio
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from checks.base import (
    AutopilotGauge,
    BaseCheck,
    CheckContext,
    CheckResult,
    Entity,
    Measure,
    ResultBuilder,
    Severity,
)
from checks.probes import ApiProblem, ProbeApi, StorageClassInfo

log = logging.getLogger(__name__)

MOUNT_PATH = "/probe"
CLEANUP_TIMEOUT_S = 15.0

_QUANTITY = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$"
_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"

ClassName = Annotated[str, StringConstraints(pattern=_DNS_SUBDOMAIN)]


class PvcParams(BaseModel):
    """Parameters of the `pvc` check."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    storage_classes: list[ClassName] = Field(
        default_factory=list, description="storage classes to probe; none: the check is SKIPPED"
    )
    size: str = Field("1Mi", pattern=_QUANTITY, description="requested size (a quantity)")
    bind_timeout_s: float = Field(60.0, gt=0, le=3600, description="how long to wait for Bound")
    allow_pods: bool = Field(
        True, description="may create a pause pod to bind WaitForFirstConsumer classes"
    )
    pod_image: str = Field("registry.k8s.io/pause:3.10", min_length=1)
    namespace: str | None = Field(
        None, pattern=_DNS_LABEL,
        description="namespace of the test objects; default: the agent's probe namespace",
    )


@dataclass(frozen=True)
class Bound:
    bind_s: float


@dataclass(frozen=True)
class NotBound:
    waited_s: float
    failure: str | None  # the provisioner's ProvisioningFailed message, if any


class PvcCheck(BaseCheck):
    """Provision, bind and delete a small test PVC per configured storage class."""

    NAME: ClassVar[str] = "pvc"
    Params: ClassVar[type[BaseModel]] = PvcParams
    DEFAULT_INTERVAL_S: ClassVar[float] = 3600.0
    DEFAULT_TIMEOUT_S: ClassVar[float] = 180.0
    DESCRIPTION: ClassVar[str] = "a small test PVC per storage class binds in time"
    MEASURES: ClassVar[tuple[Measure, ...]] = (
        Measure("healthd_storage_pvc_bind_seconds", "Seconds the test PVC took to bind.",
                "bind_s", "storage"),
    )
    AUTOPILOT: ClassVar[AutopilotGauge | None] = AutopilotGauge("pvc", per="node")
    CODES: ClassVar[tuple[str, ...]] = ("PVC_NOT_BOUND", "PVC_PROVISION_ERROR")

    params: PvcParams

    async def run(self, ctx: CheckContext) -> CheckResult:
        classes = list(dict.fromkeys(self.params.storage_classes))
        if not classes:
            return CheckResult.skipped(self.NAME, "no storage class configured")
        if self.probes.pvc_api is None:
            return CheckResult.unknown(self.NAME, "no Kubernetes client available")
        if not ctx.node_name:
            return CheckResult.unknown(self.NAME, "the node name is unknown")
        api = self.probes.pvc_api(self.params.namespace or ctx.namespace, ctx.node_name)
        try:
            swept = await api.sweep()
        except ApiProblem as exc:
            # A probe that cannot clean up must not create more objects.
            return CheckResult.unknown(self.NAME, str(exc))
        if swept:
            log.info("pvc: deleted %d object(s) left by an earlier run", swept)
        builder = ResultBuilder(self.NAME, ctx.catalog)
        async with anyio.create_task_group() as tg:
            for name in classes:
                tg.start_soon(self._probe_class, api, ctx.node_name, name, builder)
        return _with_reason(builder.build())

    async def _probe_class(
        self, api: ProbeApi, node: str, storage_class: str, builder: ResultBuilder
    ) -> None:
        entity = Entity("storage", storage_class)
        try:
            info = await api.storage_class(storage_class)
            if info is None:
                builder.unknown(entity, f"storage class {storage_class} not found")
                return
            if why := self._not_probed(info):
                builder.skip(entity, why)
                return
            outcome = await self._provision(api, node, info)
        except ApiProblem as exc:
            builder.unknown(entity, f"storage class {storage_class}: {exc}")
            return
        _record(builder, entity, outcome)

    def _not_probed(self, info: StorageClassInfo) -> str:
        """Why this class is not probed, or "" when it is."""
        if info.reclaim_policy == "Retain":
            return f"storage class {info.name} retains volumes: each probe would leak one"
        if info.wait_for_first_consumer and not self.params.allow_pods:
            return f"storage class {info.name} binds on first consumer and pods are not allowed"
        return ""

    async def _provision(
        self, api: ProbeApi, node: str, info: StorageClassInfo
    ) -> Bound | NotBound:
        """Create the PVC (and its consumer pod), wait for Bound, always delete both."""
        name = probe_name(node, info.name)
        consumer = info.wait_for_first_consumer
        timeout = self.params.bind_timeout_s
        started = anyio.current_time()
        uid: str | None = None
        try:
            with anyio.move_on_after(timeout):
                version, uid = await api.create_pvc(self.pvc_manifest(name, info.name), info.name)
                if consumer:
                    await api.create_pod(self.pod_manifest(name, node), info.name)
                await api.wait_bound(name, version)
                return Bound(anyio.current_time() - started)
            if uid is None:
                raise ApiProblem(f"the Kubernetes API did not create the test PVC in {timeout:g} s")
            return NotBound(timeout, await _failure_message(api, name, uid))
        finally:
            await _cleanup(api, name, pod=consumer)

    def pvc_manifest(self, name: str, storage_class: str) -> dict[str, Any]:
        """The test PVC (the probe API adds its labels)."""
        return {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": name},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": storage_class,
                "resources": {"requests": {"storage": self.params.size}},
            },
        }

    def pod_manifest(self, name: str, node: str) -> dict[str, Any]:
        """A pause pod that only mounts the PVC, pinned to this node through the
        scheduler, tolerating every taint (GPU nodes are usually tainted)."""
        pin = {"key": "metadata.name", "operator": "In", "values": [node]}
        affinity = {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchFields": [pin]}]
            }
        }
        container = {
            "name": "consumer",
            "image": self.params.pod_image,
            "resources": {"requests": {"cpu": "1m", "memory": "8Mi"}, "limits": {"memory": "16Mi"}},
            "securityContext": {
                "allowPrivilegeEscalation": False,
                "readOnlyRootFilesystem": True,
                "capabilities": {"drop": ["ALL"]},
            },
            "volumeMounts": [{"name": "probe", "mountPath": MOUNT_PATH}],
        }
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "affinity": {"nodeAffinity": affinity},
                "tolerations": [{"operator": "Exists"}],
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 0,
                "automountServiceAccountToken": False,
                "enableServiceLinks": False,
                "securityContext": {
                    "runAsNonRoot": True,
                    "runAsUser": 65535,
                    "seccompProfile": {"type": "RuntimeDefault"},
                },
                "containers": [container],
                "volumes": [{"name": "probe", "persistentVolumeClaim": {"claimName": name}}],
            },
        }


def probe_name(node: str, storage_class: str) -> str:
    """`healthd-pvc-<node>-<class>-<random>`, shortened to a valid 63-character name;
    the random part keeps a new probe clear of an old one still terminating."""
    return f"healthd-pvc-{_slug(node, 24)}-{_slug(storage_class, 16)}-{secrets.token_hex(3)}"


def _slug(text: str, limit: int) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", text.lower())[:limit].strip("-") or "x"


async def _failure_message(api: ProbeApi, name: str, uid: str) -> str | None:
    """The provisioner's error, if it posted one; a failure to list events still
    leaves a PVC that did not bind, so it is logged, not reported."""
    try:
        return await api.provisioning_failure(name, uid)
    except ApiProblem as exc:
        log.warning("pvc: %s", exc)
        return None


async def _cleanup(api: ProbeApi, name: str, *, pod: bool) -> None:
    """Delete the probe's objects even while the run is being cancelled (shielded),
    but never hang on a dead API (own deadline). What is left, the next run sweeps."""
    deadline = anyio.current_time() + CLEANUP_TIMEOUT_S
    with anyio.CancelScope(shield=True, deadline=deadline) as scope:
        try:
            await api.delete_probe(name, pod=pod)
        except ApiProblem as exc:
            log.warning("pvc: %s; the next run removes it", exc)
    if scope.cancelled_caught:
        log.warning(
            "pvc: deleting %s took over %g s; the next run removes it", name, CLEANUP_TIMEOUT_S
        )


def _record(builder: ResultBuilder, entity: Entity, outcome: Bound | NotBound) -> None:
    if isinstance(outcome, Bound):
        builder.seen(entity, bind_s=round(outcome.bind_s, 3))
    elif outcome.failure:
        message = f"storage class {entity.name}: provisioning failed: {outcome.failure}"
        builder.finding("PVC_PROVISION_ERROR", entity, message, timeout_s=outcome.waited_s)
    else:
        message = f"test PVC of storage class {entity.name} not bound after {outcome.waited_s:g} s"
        builder.finding("PVC_NOT_BOUND", entity, message, timeout_s=outcome.waited_s)


def _with_reason(result: CheckResult) -> CheckResult:
    """An UNKNOWN or SKIPPED run says why in one line: the reasons of those classes."""
    if result.status not in (Severity.UNKNOWN, Severity.SKIPPED):
        return result
    reasons = [e.reason for e in result.entities if e.status == result.status and e.reason]
    return replace(result, reason="; ".join(reasons))
