"""Every key, condition and reason healthd publishes, in one place.

Two prefixes, both configurable: the compatibility prefix (`autopilot.ibm.com/`,
which AppWrapper and MLBatch inject node affinities on) and the project's own
(`healthd.io/`). Condition polarity follows node-problem-detector: `GPUUnhealthy`
True means a problem is present.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

CONDITION_TYPE = "GPUUnhealthy"
COMPONENT = "healthd-agent"  # Event source / reportingController
CONTROLLER_COMPONENT = "healthd-controller"

DEFAULT_LABEL_PREFIX = "autopilot.ibm.com/"
DEFAULT_OWN_PREFIX = "healthd.io/"

GPU_RESOURCE = "nvidia.com/gpu"

# The AppWrapper operator's: the label on every pod an AppWrapper creates, and the
# `spec.managedBy` value of AppWrappers it (not another controller) manages.
APPWRAPPER_LABEL = "workload.codeflare.dev/appwrapper"
OPERATOR_MANAGER = "workload.codeflare.dev/appwrapper-controller"

# Multus publishes a pod's attachments (pod network and secondary networks) in this
# annotation; OpenShift's older releases spell it `networks-status`. Read only.
NETWORK_STATUS_ANNOTATIONS = (
    "k8s.v1.cni.cncf.io/network-status",
    "k8s.v1.cni.cncf.io/networks-status",
)


class Verdict(enum.StrEnum):
    """The node's published state (the label value). Precedence, highest first:
    EVICT > ERR > TESTING > WARN > PASS."""

    PASS = "PASS"
    WARN = "WARN"
    ERR = "ERR"
    TESTING = "TESTING"
    EVICT = "EVICT"

    @property
    def precedence(self) -> int:
        return _PRECEDENCE[self]

    @property
    def unhealthy(self) -> bool:
        """What the GPUUnhealthy condition says: True for ERR and EVICT."""
        return self in (Verdict.ERR, Verdict.EVICT)


_PRECEDENCE = {
    Verdict.PASS: 0,
    Verdict.WARN: 1,
    Verdict.TESTING: 2,
    Verdict.ERR: 3,
    Verdict.EVICT: 4,
}


class Reason(enum.StrEnum):
    """Event and condition reasons that are not finding codes (CamelCase)."""

    HEALTHY = "GPUsHealthy"
    RECOVERED = "Recovered"
    CANNOT_JUDGE = "ChecksUnknown"
    TESTING = "DiagnosticRunning"
    DIAGNOSTIC_FAILED = "DiagnosticFailed"
    BAD_REQUEST = "BadHealthRequest"
    REQUEST_DONE = "HealthRequestDone"
    CLEARED = "HealthCleared"
    NODE_EVICTED = "NodeEvicted"
    APPWRAPPER_RESET = "AppWrapperReset"
    RESET_BREAKER_OPEN = "ResetBreakerOpen"
    RESET_BREAKER_CLOSED = "ResetBreakerClosed"
    LENDING_LIMIT_UPDATED = "LendingLimitUpdated"
    LENDING_LIMIT_REJECTED = "LendingLimitRejected"  # the server refused the value (422)
    LENDING_LIMIT_CONFLICT = "LendingLimitConflict"  # 409 or a moving queue on every retry
    NODE_WRITE_CONFLICT = "NodeWriteConflict"  # the agent's Node write met 409 on every retry
    LENDING_SHORTFALL = "LendingShortfall"
    PEER_UNREACHABLE = "PeerUnreachable"
    CHECK_UNAVAILABLE = "CheckUnavailable"


@dataclass(frozen=True)
class Keys:
    """The label and annotation keys under the configured prefixes."""

    label_prefix: str = DEFAULT_LABEL_PREFIX
    own_prefix: str = DEFAULT_OWN_PREFIX

    @property
    def gpuhealth(self) -> str:
        """Label: the verdict (PASS/WARN/ERR/TESTING/EVICT)."""
        return f"{self.label_prefix}gpuhealth"

    def dcgm_level(self, level: int) -> str:
        """Label: PASS_/ERR_<timestamp> after a level-N DCGM diagnostic."""
        return f"{self.label_prefix}dcgm.level.{level}"

    @property
    def health(self) -> str:
        """Annotation: bounded JSON of verdict, per-check status and findings."""
        return f"{self.own_prefix}health"

    @property
    def peers(self) -> str:
        """Annotation written by the controller: the peers this node's agent pings
        (healthd.blame.peersets)."""
        return f"{self.own_prefix}peers"

    @property
    def run(self) -> str:
        """Annotation written by admins: an on-demand request (`all`, `dcgm:3`, ...)."""
        return f"{self.own_prefix}run"

    @property
    def run_id(self) -> str:
        """Annotation written with `run` (or with `clear` alone) by tools that wait for
        the answer: its id."""
        return f"{self.own_prefix}run-id"

    @property
    def last_run(self) -> str:
        """Annotation: JSON answer to the last on-demand request."""
        return f"{self.own_prefix}last-run"

    @property
    def clear(self) -> str:
        """Annotation written by admins: `true` re-runs what holds the node bad."""
        return f"{self.own_prefix}clear"

    @property
    def clearing(self) -> str:
        """Annotation written by the agent with the take of a clear, removed with its
        answer: the clear in flight (healthd.published.Clearing), which a restarted
        agent carries out and answers."""
        return f"{self.own_prefix}clearing"

    @property
    def repair(self) -> str:
        """Annotation written by the controller only: the node's repair state and
        history (healthd.published.Repair)."""
        return f"{self.own_prefix}repair"

    @property
    def nvml_released(self) -> str:
        """Annotation written by the agent while the repair record says `resetting`,
        once it has let go of NVML on the node: the record's GPU-reset Job
        (namespace/name) it let go for. Absent while the agent may hold NVML."""
        return f"{self.own_prefix}nvml-released"

    # -- labels on the objects the agent creates (diagnostic Jobs, pvc probes) -----

    @property
    def diagnostic(self) -> str:
        """Label `true` on the agent's diagnostic Jobs and pods: never GPU holders."""
        return f"{self.own_prefix}diagnostic"

    @property
    def node(self) -> str:
        """Label: the node an object was created for (as a label value)."""
        return f"{self.own_prefix}node"

    @property
    def node_name(self) -> str:
        """Annotation: the node's full name, should the `node` label be shortened."""
        return f"{self.own_prefix}node-name"

    @property
    def gpu_reset(self) -> str:
        """Label `true` on the controller's GPU-reset Jobs and their pods."""
        return f"{self.own_prefix}gpu-reset"

    @property
    def check(self) -> str:
        """Label on a diagnostic Job: the check key it runs."""
        return f"{self.own_prefix}check"

    @property
    def diagnostic_run(self) -> str:
        """Annotation on a diagnostic Job: what its run is for (the check key, the
        trigger, the request to answer; healthd.agent.deeprecord), so whichever agent
        runs on the node when it ends can finish it."""
        return f"{self.own_prefix}diagnostic-run"

    @property
    def probe(self) -> str:
        """Label on the pvc check's test PVCs and pods: `pvc`."""
        return f"{self.own_prefix}probe"

    @property
    def storage_class(self) -> str:
        """Label on the pvc check's test objects: the storage class probed."""
        return f"{self.own_prefix}storage-class"

    def owns_label(self, key: str) -> bool:
        return key == self.gpuhealth or key.startswith(f"{self.label_prefix}dcgm.level.")

    def owns_annotation(self, key: str) -> bool:
        return key.startswith(self.own_prefix)


def dcgm_label_value(passed: bool, at_epoch_s: float) -> str:
    """`PASS_2025-05-13_19.54.55UTC` (Autopilot's format, seconds included)."""
    import time

    stamp = time.strftime("%Y-%m-%d_%H.%M.%SUTC", time.gmtime(at_epoch_s))
    return f"{'PASS' if passed else 'ERR'}_{stamp}"
