"""The `controller:` section of the config: what `healthd controller` watches, what it
counts as unavailable, how it paces resets and how it elects a leader.

Frozen pydantic models, validated with the rest of the config at start (errors name
the field). Durations accept `30s`, `5m`, `1h` and are stored as seconds::

    controller:
      slack_queues: [slack-cluster-queue]
      unavailable_verdicts: [ERR, TESTING, EVICT]   # WARN and PASS never count
      capacity_source: capacity                     # or allocatable
      dry_run: false
      gpu_resource: nvidia.com/gpu
      http_port: 9401
      resets: {rate_per_minute: 60, burst: 10, min_spacing: 5m}
      breaker: {max_unhealthy: 30%, min_allowed: 1, window: 5m, hold: 5m}
      election: {lease_name: healthd-controller, namespace: healthd-system,
                 lease_duration: 15s, renew_deadline: 10s, retry_period: 2s}
      repair: {enabled: false, max_gpu_resets: 2, max_reboots: 2, window: 24h,
               remedies: {},                  # e.g. {XID_48: reboot, NIC_DOWN: humans}
               validation: [pciebw, "dcgm:2"], validation_timeout: 30m,
               namespace: healthd-system-repair, reset_deadline: 15m,
               reboot: null,                  # or a remediation template (below)
               reboot_timeout: 30m, validate_new_nodes: false}
      peers: {count: 16, rotate_every: 1h}  # ping's peer sets, on each Node
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

import checks
from checks.catalog import is_known_code
from healthd.config.selection import SelectionError, parse_selection
from healthd.kube.conventions import CONTROLLER_COMPONENT, GPU_RESOURCE, Verdict
from healthd.util.durations import Duration, Interval
from healthd.util.models import Frozen

DEFAULT_NAMESPACE = "healthd-system"
DEFAULT_REPAIR_NAMESPACE = "healthd-system-repair"
DEFAULT_SLACK_QUEUE = "slack-cluster-queue"
_COUNTABLE = (Verdict.ERR, Verdict.TESTING, Verdict.EVICT)
_THRESHOLD = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(%?)\s*$")


def parse_threshold(value: object) -> tuple[float, bool]:
    """`("30%")` -> (30.0, True), `5` or `"5"` -> (5.0, False). ValueError otherwise."""
    if isinstance(value, bool):
        raise ValueError("expected a count like 5 or a percentage like 30%")
    if isinstance(value, int):
        value = str(value)
    match = _THRESHOLD.match(value) if isinstance(value, str) else None
    if match is None:
        raise ValueError(f"expected a count like 5 or a percentage like 30%, got {value!r}")
    number, percent = float(match.group(1)), bool(match.group(2))
    if percent and number > 100:
        raise ValueError(f"a percentage must be at most 100%, got {value!r}")
    if not percent and not number.is_integer():
        raise ValueError(f"a node count must be a whole number, got {value!r}")
    return number, percent


def tolerated_bad_nodes(max_unhealthy: str, min_allowed: int, gpu_nodes: int) -> float:
    """The most bad nodes tolerated among `gpu_nodes`: the threshold (a share or a
    count) or the floor `min_allowed`, whichever is larger."""
    number, percent = parse_threshold(max_unhealthy)
    threshold = gpu_nodes * number / 100 if percent else number
    return max(threshold, min_allowed)


class ResetSettings(Frozen):
    """How fast AppWrappers may be reset: a token bucket, and a minimum spacing per
    AppWrapper so a flapping node label cannot reset the same work over and over."""

    rate_per_minute: float = Field(60.0, gt=0, le=1e6, allow_inf_nan=False,
                                   description="resets per minute, sustained")
    burst: int = Field(10, ge=1, description="resets allowed at once before the rate applies")
    min_spacing: Duration = Field(
        300.0, description="least time between two resets of one AppWrapper"
    )


class BreakerSettings(Frozen):
    """The circuit breaker: when too many GPU nodes turn bad together the health signal
    itself is suspect, so resets stop (lending still tracks the truth)."""

    max_unhealthy: str = Field(
        "30%", description="bad GPU nodes tolerated in a window: a count (5) or a share (30%)"
    )
    min_allowed: int = Field(
        1, ge=0, description="bad GPU nodes always tolerated, whatever the share says "
        "(the larger of the two wins): one bad node is handled even on a small cluster"
    )
    window: Duration = Field(300.0, description="how far back bad nodes are counted")
    hold: Duration = Field(
        300.0, description="the fleet must stay under the threshold this long to close again"
    )

    @field_validator("max_unhealthy", mode="before")
    @classmethod
    def _threshold(cls, value: object) -> str:
        parse_threshold(value)
        return str(value).strip()

    def limit(self, gpu_nodes: int) -> float:
        """The most bad nodes tolerated among `gpu_nodes` (more opens the breaker)."""
        return tolerated_bad_nodes(self.max_unhealthy, self.min_allowed, gpu_nodes)


class ElectionSettings(Frozen):
    """Leader election on a coordination.k8s.io/v1 Lease: one replica acts."""

    lease_name: str = Field(CONTROLLER_COMPONENT, min_length=1, description="the Lease's name")
    namespace: str = Field(DEFAULT_NAMESPACE, min_length=1, description="the Lease's namespace")
    lease_duration: Duration = Field(15.0, description="a standby takes over after this")
    renew_deadline: Duration = Field(10.0, description="the leader gives up if not renewed by")
    retry_period: Interval = Field(2.0, description="how often to try to acquire or renew")

    @model_validator(mode="after")
    def _ordered(self) -> ElectionSettings:
        if not self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError("need retry_period < renew_deadline < lease_duration "
                             "(e.g. 2s < 10s < 15s)")
        return self


RemedyName = Literal["reset", "reboot", "humans", "none"]
TEMPLATE_SUFFIX = "Template"
_GROUP_VERSION = re.compile(r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?\.[a-z0-9.-]+/v[0-9][a-z0-9]*$")
_TEMPLATE_KIND = re.compile(r"^[A-Z][A-Za-z0-9]*Template$")


class RemediationTemplate(Frozen):
    """The reboot hand-off: a remediation template, named as medik8s NodeHealthCheck's
    `remediationTemplate` names one (e.g. `remediation.medik8s.io/v1alpha1`
    `SelfNodeRemediationTemplate`). The request the controller creates for a node is
    of the kind without the `Template` suffix, in the same group and namespace."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    api_version: str = Field(alias="apiVersion",
                             description="group/version of the template and the request")
    kind: str = Field(description="the template's kind; the request's is this minus Template")
    namespace: str = Field(min_length=1, description="where the template is and the "
                           "requests are created")
    name: str = Field(min_length=1, description="the template's name")

    @field_validator("api_version")
    @classmethod
    def _group_version(cls, value: str) -> str:
        if not _GROUP_VERSION.match(value):
            raise ValueError(f"{value!r} is not a custom resource's group/version: write "
                             "it as NodeHealthCheck does, e.g. remediation.medik8s.io/v1alpha1")
        return value

    @field_validator("kind")
    @classmethod
    def _template_kind(cls, value: str) -> str:
        if not _TEMPLATE_KIND.match(value):
            raise ValueError(f"{value!r} is not a template's kind: name the template (e.g. "
                             "SelfNodeRemediationTemplate); the request's kind is it without "
                             "Template")
        return value

    @property
    def request_kind(self) -> str:
        return self.kind.removesuffix(TEMPLATE_SUFFIX)




# The NVIDIA GPU Operator's operands that hold a node's GPUs, each a DaemonSet that
# selects its nodes on one of these labels: "false" removes its pod from the node.
GPU_OPERATOR_OPERANDS = (
    "nvidia.com/gpu.deploy.device-plugin",
    "nvidia.com/gpu.deploy.dcgm",
    "nvidia.com/gpu.deploy.dcgm-exporter",
    "nvidia.com/gpu.deploy.gpu-feature-discovery",
)


class GpuOperatorSettings(Frozen):
    """Pausing the GPU Operator's operands on a node while its GPUs are reset: a real
    `nvidia-smi --gpu-reset` refuses a GPU their NVML sessions hold."""

    enabled: bool = Field(
        True, description="pause the operands on a node being reset; only the operand "
        "labels the node carries are touched (the operator labels every GPU node it "
        "manages), so a cluster without the operator loses nothing")
    operands: tuple[str, ...] = Field(
        GPU_OPERATOR_OPERANDS, description="the operand labels set to false before a "
        "reset and put back after it")

    @field_validator("operands")
    @classmethod
    def _label_keys(cls, keys: tuple[str, ...]) -> tuple[str, ...]:
        bad = [k for k in keys if not _LABEL_KEY.fullmatch(k)]
        if bad:
            raise ValueError(f"not a label key: {', '.join(bad)} (e.g. "
                             "nvidia.com/gpu.deploy.dcgm)")
        return keys


_LABEL_KEY = re.compile(r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*"
                        r"[A-Za-z0-9])?")


class RepairSettings(Frozen):
    """Repairs after the AppWrapper reset (healthd.repair.decision): what each finding
    needs, and how often a node may be repaired before it goes to humans."""

    enabled: bool = Field(False, description="repair nodes (GPU resets, reboot requests)")
    remedies: dict[str, RemedyName] = Field(
        {}, description="per finding code, overriding the default table: reset, reboot, "
        "humans (hardware inspection) or none (healthd does not repair it)")
    max_gpu_resets: int = Field(2, ge=0, description="GPU resets per node in the window "
                                "before a reboot is asked instead")
    max_reboots: int = Field(2, ge=0, description="reboot requests per node in the window "
                             "before hardware inspection")
    window: Duration = Field(86400.0, description="how far back repairs count")
    validation: tuple[str, ...] = Field(
        ("pciebw", "dcgm:2"), description="check keys run after a repair besides those that "
        "raised the repaired findings (each only where the agents' config enables it)")
    validation_timeout: Duration = Field(
        1800.0, description="a validation the node's agent has not answered by then failed")
    namespace: str = Field(DEFAULT_REPAIR_NAMESPACE, min_length=1,
                           description="namespace of the GPU-reset Jobs (Pod Security "
                           "privileged: nvidia-smi --gpu-reset needs it)")
    reset_deadline: Duration = Field(
        900.0, description="a GPU-reset Job must be scheduled and done within this long "
        "(its activeDeadlineSeconds), or the reset failed")
    release_timeout: Duration = Field(
        300.0, description="how long the node's agent and the paused GPU Operator operands "
        "may take to let go of the GPUs before the reset is given up as refused")
    max_refusals: int = Field(3, ge=1, description="GPU resets refused in a row (something "
                              "still held the GPUs) before the node is held, naming it")
    attempt_pause: Duration = Field(
        60.0, description="the pause after an attempt that did not pass (failed, refused, "
        "timed out) before the next; doubled after each one in a row")
    attempt_pause_max: Duration = Field(3600.0, description="the longest pause")
    gpu_operator: GpuOperatorSettings = Field(default_factory=GpuOperatorSettings)
    reboot: RemediationTemplate | None = Field(
        None, description="the remediation template a reboot request is made from; none: "
        "a node that needs a reboot is held, saying so")
    reboot_timeout: Duration = Field(
        1800.0, description="a node whose boot id has not changed by then was not rebooted: "
        "the request is withdrawn and the node goes to hardware inspection")
    validate_new_nodes: bool = Field(
        False, description="run the validation set on a GPU node that has never had a "
        "repair record (a new node) before it counts as PASS")

    @field_validator("validation")
    @classmethod
    def _known_checks(cls, keys: tuple[str, ...]) -> tuple[str, ...]:
        """Each a check key the agents know (NAME or NAME:ARG), as a request names it."""
        if keys:
            try:
                parse_selection(",".join(keys), checks.REGISTRY)
            except SelectionError as exc:
                raise ValueError(str(exc)) from None
        return keys

    @field_validator("remedies")
    @classmethod
    def _known_codes(cls, remedies: dict[str, str]) -> dict[str, str]:
        unknown = sorted(c for c in remedies if not is_known_code(c))
        if unknown:
            raise ValueError(f"unknown finding code(s) {', '.join(unknown)}: use a code "
                             "from the catalog (e.g. REMAP_PENDING, XID_79)")
        return remedies


class PeerSetSettings(Frozen):
    """The ping check's peers, which the controller publishes on each Node
    (healthd.blame.peersets): how many each node probes, and how often they rotate.
    Where the agent pods are is the agent section's `peers`."""

    count: int = Field(16, ge=1, le=32, description="peers each node probes per network "
                       "(each node is probed by as many)")
    rotate_every: Duration = Field(3600.0, ge=60.0, description="the sets change every "
                                   "interval: one annotation write per node per interval")


class ControllerSettings(Frozen):
    """Everything `healthd controller` is told; built once by the config loader."""

    slack_queues: tuple[str, ...] = Field(
        (DEFAULT_SLACK_QUEUE,), description="ClusterQueues whose lendingLimit follows capacity"
    )
    unavailable_verdicts: tuple[Verdict, ...] = Field(
        _COUNTABLE, description="node verdicts whose capacity is unavailable (ERR TESTING EVICT)"
    )
    capacity_source: Literal["capacity", "allocatable"] = Field(
        "capacity", description="node status field that gives a node's capacity"
    )
    dry_run: bool = Field(False, description="decide, log and count, but write nothing")
    gpu_resource: str = Field(GPU_RESOURCE, min_length=1, description="the GPU resource name")
    health_resources: tuple[str, ...] = Field(
        (GPU_RESOURCE,),
        description="resources a bad health verdict withholds (cordon and NotReady "
        "withhold the whole node)",
    )
    http_port: int = Field(9401, ge=1, le=65535, description="/metrics, /healthz, /readyz")
    resets: ResetSettings = ResetSettings()
    breaker: BreakerSettings = BreakerSettings()
    election: ElectionSettings = ElectionSettings()
    repair: RepairSettings = RepairSettings()
    peers: PeerSetSettings = PeerSetSettings()

    @field_validator("slack_queues")
    @classmethod
    def _queue_names(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        if any(not n.strip() for n in names):
            raise ValueError("queue names must not be empty")
        return tuple(dict.fromkeys(names))

    @field_validator("unavailable_verdicts")
    @classmethod
    def _countable(cls, verdicts: tuple[Verdict, ...]) -> tuple[Verdict, ...]:
        wrong = [v.value for v in verdicts if v not in _COUNTABLE]
        if wrong:
            raise ValueError(f"{', '.join(wrong)} cannot make capacity unavailable: "
                             "choose among ERR, TESTING, EVICT")
        return tuple(dict.fromkeys(verdicts))

    @property
    def bad_verdicts(self) -> frozenset[Verdict]:
        """`unavailable_verdicts` as a set, the shape `health.unavailability` takes."""
        return frozenset(self.unavailable_verdicts)
