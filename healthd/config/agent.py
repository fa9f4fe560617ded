"""The `agent:` section of the config: how `healthd agent` schedules, judges, serves
and runs deep diagnostics.

Frozen pydantic models, validated with the rest of the config at start (errors name
the field). Per-check schedules stay in the config's `checks:` section (enabled,
interval, cron, timeout, params); this section adds what only the agent needs:

    agent:
      recover_after: 2            # consecutive passes that release a held finding
      http_port: 9400             # /metrics, /healthz, /readyz
      jitter: 0.1                 # fraction of each interval, spreads a fleet's checks
      diagnostics:                # deep (exclusive) diagnostics run only when listed here
        - {check: "dcgm:3", cron: "0 3 * * 0"}
      deep_diagnostics: {namespace: healthd-system-probes, image: ..., schedule_deadline: 5m}
      peers: {namespace: healthd-system, label_selector: app.kubernetes.io/name=healthd-agent}
      kernel_log: {path: /dev/kmsg, state_file: /var/lib/healthd/kmsg-position.json}
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, field_validator, model_validator

import checks
from healthd.config.selection import SelectionError, parse_selection
from healthd.util.durations import Duration, Interval
from healthd.util.models import Frozen

DEFAULT_IMAGE = "ghcr.io/healthd/healthd:0.1.0"
DEFAULT_NAMESPACE = "healthd-system"
# What the agent creates lives apart from the agents and the controller (namespace.yaml).
DEFAULT_PROBE_NAMESPACE = "healthd-system-probes"
AGENT_SELECTOR = "app.kubernetes.io/name=healthd-agent"


class DeepDiagSettings(Frozen):
    """How an exclusive diagnostic runs: a Job pinned to the node that requests all
    its GPUs (so the scheduler keeps other work off them while it runs)."""

    namespace: str = Field(DEFAULT_PROBE_NAMESPACE,
                           description="namespace of the diagnostic Jobs and the pvc probe")
    image: str = Field(DEFAULT_IMAGE, description="image with `healthd` and DCGM")
    priority_class: str | None = Field(
        None, description="priorityClassName of the Job's pod (unset: none)"
    )
    runtime_class: str | None = Field(
        None, description="runtimeClassName of the Job's pod, as the agent's own (unset: none)"
    )
    tolerations: list[dict[str, Any]] = Field(
        default_factory=lambda: [{"operator": "Exists"}],
        description="pod tolerations: the node may be tainted because it is unhealthy",
    )
    service_account: str | None = Field(None, description="service account of the Job's pod")
    schedule_deadline_s: Duration = Field(
        300.0, description="the Job's pod must start within this long, or the run fails"
    )
    run_deadline_s: Duration = Field(
        3600.0, description="the diagnostic must finish within this long once started"
    )


class PeerSettings(Frozen):
    """Where the other agents are: their pods' IPs are the ping check's peers."""

    namespace: str = Field(DEFAULT_NAMESPACE, description="namespace of the agent pods")
    label_selector: str = Field(AGENT_SELECTOR, description="selects the agent pods")


def cron_expression(value: str | None) -> str | None:
    """`value` when it is a crontab expression the agent's scheduler accepts (5
    fields, UTC); ValueError naming what is wrong otherwise."""
    if value is not None:
        from apscheduler.triggers.cron import CronTrigger

        try:
            CronTrigger.from_crontab(value, timezone="UTC")
        except (ValueError, TypeError) as exc:
            raise ValueError(f"invalid cron expression {value!r}: {exc}") from None
    return value


ApiTimeout = Annotated[Duration, Field(le=300.0)]


class ScheduleEntry(Frozen):
    """A check the agent runs on its own schedule beyond the `checks:` section: deep
    diagnostics (`dcgm:3`) run only when listed here."""

    check: str = Field(description="a check key: NAME or NAME:ARG, e.g. dcgm:3")
    interval: Interval | None = Field(None, description="run every interval")
    cron: str | None = Field(None, description="crontab expression (5 fields), UTC")
    timeout: Duration | None = Field(None, description="unset: the check's own deadline")

    @field_validator("check")
    @classmethod
    def _one_known_check(cls, value: str) -> str:
        try:
            selected = parse_selection(value, checks.REGISTRY)
        except SelectionError as exc:
            raise ValueError(str(exc)) from None
        if len(selected) != 1 or value.strip() == "all":
            raise ValueError("name exactly one check, e.g. dcgm:3")
        return str(selected[0])

    @field_validator("cron")
    @classmethod
    def _valid_cron(cls, value: str | None) -> str | None:
        return cron_expression(value)

    @model_validator(mode="after")
    def _one_schedule(self) -> ScheduleEntry:
        if (self.interval is None) == (self.cron is None):
            raise ValueError("give exactly one of interval or cron")
        return self


class KernelLogSettings(Frozen):
    """Where the agent reads XIDs and SXIDs that NVML did not deliver live (the
    kernel log), and where it keeps its position so a restart neither loses nor
    repeats one. Reading /dev/kmsg needs CAP_SYSLOG when kernel.dmesg_restrict=1."""

    enabled: bool = Field(True, description="read the kernel log (xid and sxid checks)")
    path: str = Field("/dev/kmsg", description="the kernel log: /dev/kmsg, or a file in its format")
    state_file: str = Field(
        "/var/lib/healthd/kmsg-position.json",
        description="the last kernel-log record each check has read, per boot",
    )
    dedup_window_s: float = Field(
        10.0, ge=0, le=3600,
        description="an XID in the log and from NVML this close together on one GPU counts once",
    )


class AgentSettings(Frozen):
    """The `agent:` config section."""

    recover_after: int = Field(
        2, ge=1, le=100, description="consecutive passing runs that release a held finding"
    )
    flap_window: int = Field(
        100, ge=1, le=10000,
        description="runs without a sighting after which a finding's flaps are forgotten",
    )
    flap_max_doublings: int = Field(
        5, ge=0, le=10,
        description="each flap doubles recover_after twice; at most this many doublings",
    )
    min_hold: int = Field(
        6, ge=0, le=1000,
        description="runs of its check a raised finding stays held at least",
    )
    http_port: int = Field(9400, ge=0, le=65535, description="port of /metrics, /healthz, /readyz")
    jitter: float = Field(
        0.1, ge=0, le=0.5, description="random delay of each run, as a fraction of its interval"
    )
    xid_window_s: float = Field(
        0.5, ge=0, le=10, description="window of the periodic xid check (events also stream)"
    )
    api_timeout_s: ApiTimeout = Field(10.0, description="deadline of one Kubernetes API request")
    shutdown_flush_s: Duration = Field(
        5.0, description="on SIGTERM, how long to wait for the last state to be written"
    )
    diagnostics: list[ScheduleEntry] = Field(
        default_factory=list, description="deep diagnostics and their schedules (off by default)"
    )
    deep_diagnostics: DeepDiagSettings = DeepDiagSettings()
    peers: PeerSettings = PeerSettings()
    kernel_log: KernelLogSettings = KernelLogSettings()
