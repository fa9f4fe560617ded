"""The repair decision, pure: from what a node publishes and what the cluster says
about it, the ONE next step healthd takes to bring the node back.

What a finding needs (its remedy, `Remedy`), from the default table below or the
config's override per code:

    reset    a GPU reset in place clears it (a pending row remap, retired pages
             pending, the driver asking for a GPU reset)
    reboot   only a reboot can (a GPU lost from the bus, the driver asking for a node
             reboot, a fatal PCIe error)
    humans   nothing healthd can do will (a failed row remap, DCGM asking to isolate
             the GPU): hardware inspection

A code the table does not name needs no repair by healthd (a network, NIC or storage
finding: the GPUs are not what is wrong), and a node with no finding to repair gets
`Step.NOTHING`.

The step, in this order of precedence:

1. `HARDWARE_INSPECTION` once a node is there: nothing more is tried until an admin
   clears the node (the state lives in the cluster, not here);
2. `HELD` when a repair is not ours to do now, with the reason: the node opted out
   (medik8s' `remediation.medik8s.io/exclude-from-remediation=true`), someone else
   cordoned it, or the reset breaker is open (a mass failure is a cluster problem,
   not a GPU one);
3. escalation by budget: a reset needed after `max_gpu_resets` resets in the window
   becomes a reboot; a reboot needed after `max_reboots` reboot requests in the window
   becomes `HARDWARE_INSPECTION` (gpud's rule: reboots that did not clear a fault
   mean hardware);
4. `WAIT` while a running pod still holds the node's GPUs (the AppWrapper reset
   moves the work; a repair never pulls GPUs from under a job);
5. `HELD` once `max_refusals` GPU resets in a row were refused (something outside
   healthd still holds the GPUs: a host daemon, persistence mode it could not turn
   off); a refused reset reset nothing, so it is not spent from the budget;
6. `WAIT` for the pause after an attempt that did not pass (`pause`, doubled after
   each one in a row up to `pause_max`): a flaky validation must not spend the whole
   budget, nor move a node from reset to reboot to humans, within seconds;
7. `REBOOT` (it also clears whatever a reset would), else `RESET_GPUS` of exactly the
   GPUs whose findings need one.

`dry_run` is not decided here: the step is the same, its executor only tells.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from healthd.config.controller import RepairSettings
from healthd.published import Holding

OPT_OUT_LABEL = "remediation.medik8s.io/exclude-from-remediation"


class Remedy(enum.StrEnum):
    """What clears a finding, in escalating order."""

    RESET = "reset"
    REBOOT = "reboot"
    HUMANS = "humans"

    @property
    def rank(self) -> int:
        return _RANK[self]


_RANK = {Remedy.RESET: 0, Remedy.REBOOT: 1, Remedy.HUMANS: 2}

# The default remedy per finding code; docs/verdicts.md says why for each.
DEFAULT_REMEDIES: Mapping[str, Remedy] = {
    "REMAP_PENDING": Remedy.RESET,
    "PAGES_PENDING": Remedy.RESET,
    "RECOVERY_GPU_RESET": Remedy.RESET,
    "RECOVERY_BUS_RESET": Remedy.RESET,
    "RECOVERY_DRAIN_AND_RESET": Remedy.RESET,
    "XID_48": Remedy.RESET,
    "XID_62": Remedy.RESET,
    "XID_95": Remedy.RESET,
    "XID_119": Remedy.RESET,
    "XID_120": Remedy.RESET,
    "XID_140": Remedy.RESET,
    "RECOVERY_NODE_REBOOT": Remedy.REBOOT,
    "RECOVERY_SYSTEM_REBOOT": Remedy.REBOOT,
    "XID_79": Remedy.REBOOT,
    "GPU_MISSING": Remedy.REBOOT,
    "PCIE_AER_FATAL": Remedy.REBOOT,
    "SXID_FATAL": Remedy.REBOOT,
    "REMAP_FAILURE": Remedy.HUMANS,
    "DCGM_ISOLATE": Remedy.HUMANS,
    "XID_64": Remedy.HUMANS,
}


REFUSED = "refused"
UNSUCCESSFUL = frozenset({"failed", "timed-out", REFUSED})
RESET_REFUSED = "GPU reset refused"  # how a held reason starts after too many refusals


class Step(enum.StrEnum):
    NOTHING = "nothing"
    HELD = "held"
    WAIT = "wait"
    RESET_GPUS = "reset-gpus"
    REBOOT = "reboot"
    HARDWARE_INSPECTION = "hardware-inspection"


@dataclass(frozen=True)
class Finding:
    """A held finding as the repair sees it: its code and the GPU it is on."""

    code: str
    uuid: str = ""  # empty for a node-wide finding


def findings_of(held: Iterable[Holding]) -> tuple[Finding, ...]:
    """The published held findings (the health annotation's `held[]`) as the repair
    sees them."""
    return tuple(dict.fromkeys(Finding(h.code, h.uuid) for h in held))


@dataclass(frozen=True)
class Attempt:
    """One repair carried out (or requested) on the node, as its history records it."""

    remedy: Remedy  # RESET or REBOOT
    at: float  # Unix time
    gpus: tuple[str, ...] = ()
    outcome: str = ""  # "" in flight; "passed", "failed", "timed-out", "refused"
    ended: float | None = None  # Unix time the outcome was known
    note: str = ""  # what the outcome said (a refusal names what held the GPUs)

    @property
    def unsuccessful(self) -> bool:
        return self.outcome in UNSUCCESSFUL

    @property
    def spent(self) -> bool:
        """Whether it counts against the budget: a refused reset reset nothing."""
        return self.outcome != REFUSED


@dataclass(frozen=True)
class Situation:
    """Everything the decision reads about one node, at `now`."""

    findings: tuple[Finding, ...]
    now: float
    history: tuple[Attempt, ...] = ()
    in_inspection: bool = False
    pods_on_gpus: int = 0  # running pods that hold any of the node's GPUs
    opted_out: bool = False
    foreign_cordon: bool = False
    breaker_open: bool = False


@dataclass(frozen=True)
class Policy:
    """The decision's settings (the config's `controller.repair`)."""

    remedies: Mapping[str, Remedy | None] = field(default_factory=lambda: DEFAULT_REMEDIES)
    max_gpu_resets: int = 2
    max_reboots: int = 2
    window_s: float = 86400.0
    max_refusals: int = 3
    pause_s: float = 60.0
    pause_max_s: float = 3600.0

    def remedy(self, code: str) -> Remedy | None:
        return self.remedies.get(code)

    @classmethod
    def from_settings(cls, settings: RepairSettings) -> Policy:
        """The config's `controller.repair`: its remedies over the default table."""
        remedies: dict[str, Remedy | None] = dict(DEFAULT_REMEDIES)
        for code, name in settings.remedies.items():
            remedies[code] = None if name == "none" else Remedy(name)
        return cls(remedies, settings.max_gpu_resets, settings.max_reboots, settings.window,
                   settings.max_refusals, settings.attempt_pause, settings.attempt_pause_max)


@dataclass(frozen=True)
class Decision:
    step: Step
    reason: str
    gpus: tuple[str, ...] = ()  # the GPUs to reset (RESET_GPUS)
    retry_at: float | None = None  # WAIT for a pause: when to decide again


def decide(situation: Situation, policy: Policy) -> Decision:
    """The one next step for the node; see the module docstring."""
    needed = _needed(situation.findings, policy)
    if situation.in_inspection:
        return Decision(Step.HARDWARE_INSPECTION, "in hardware inspection until an admin "
                        "clears the node")
    if not needed:
        return Decision(Step.NOTHING, "no finding that a repair clears")
    held = _held_because(situation)
    if held:
        return Decision(Step.HELD, held)
    remedy, why = _escalated(max(needed.values(), key=lambda r: r.rank), situation, policy)
    if remedy is Remedy.HUMANS:
        return Decision(Step.HARDWARE_INSPECTION, why)
    if situation.pods_on_gpus:
        return Decision(Step.WAIT, f"{situation.pods_on_gpus} running pod(s) still hold "
                        "the node's GPUs")
    recent = _recent(situation, policy)
    refused = _trailing(recent, lambda a: a.outcome == REFUSED)
    if remedy is Remedy.RESET and refused and len(refused) >= policy.max_refusals:
        return Decision(Step.HELD, f"{RESET_REFUSED} {len(refused)} time(s) in a row: "
                        f"{refused[-1].note or 'something still holds the GPUs'}")
    paused = _pause(recent, situation.now, policy)
    if paused is not None:
        return paused
    if remedy is Remedy.REBOOT:
        return Decision(Step.REBOOT, why)
    # A GPU with two findings a reset clears is reset once.
    gpus = tuple(sorted({f.uuid for f, r in needed.items() if r is Remedy.RESET and f.uuid}))
    if not gpus:  # a node-wide finding a reset would clear: only a reboot reaches it
        return Decision(Step.REBOOT, f"{why}; no GPU named, so a reset cannot reach it")
    return Decision(Step.RESET_GPUS, why, gpus)


def _needed(findings: Iterable[Finding], policy: Policy) -> dict[Finding, Remedy]:
    """The findings a repair clears, with what each needs."""
    out = {}
    for finding in findings:
        remedy = policy.remedy(finding.code)
        if remedy is not None:
            out[finding] = remedy
    return out


def _held_because(situation: Situation) -> str:
    if situation.opted_out:
        return f"the node is labelled {OPT_OUT_LABEL}=true"
    if situation.foreign_cordon:
        return "the node was cordoned by someone else"
    if situation.breaker_open:
        return "the reset breaker is open: too many nodes went bad together"
    return ""


def _escalated(remedy: Remedy, situation: Situation, policy: Policy) -> tuple[Remedy, str]:
    """The remedy after the node's budget (tried too often: the next rung up), and why."""
    if remedy is Remedy.HUMANS:
        return remedy, "no repair clears these findings"
    recent = [a for a in _recent(situation, policy) if a.spent]
    resets = sum(a.remedy is Remedy.RESET for a in recent)
    reboots = sum(a.remedy is Remedy.REBOOT for a in recent)
    why = f"the findings need a {remedy.value}"
    if remedy is Remedy.RESET and resets >= policy.max_gpu_resets:
        remedy, why = Remedy.REBOOT, f"{resets} GPU reset(s) did not clear the findings"
    if remedy is Remedy.REBOOT and reboots >= policy.max_reboots:
        remedy, why = Remedy.HUMANS, f"{reboots} reboot(s) did not clear the findings"
    return remedy, why


def _recent(situation: Situation, policy: Policy) -> list[Attempt]:
    return [a for a in situation.history if situation.now - a.at < policy.window_s]


def _trailing(attempts: list[Attempt], which: Callable[[Attempt], bool]) -> list[Attempt]:
    """The attempts at the end of `attempts` for which `which` holds, oldest first."""
    out: list[Attempt] = []
    for attempt in reversed(attempts):
        if not which(attempt):
            break
        out.insert(0, attempt)
    return out


def _pause(recent: list[Attempt], now: float, policy: Policy) -> Decision | None:
    """WAIT while the pause after the last attempt (if it did not pass) runs: `pause`
    after one, doubled for each further one in a row, at most `pause_max`."""
    streak = _trailing(recent, lambda a: a.unsuccessful)
    if not streak or streak[-1].ended is None:
        return None
    last = streak[-1]
    pause = min(policy.pause_s * 2 ** (len(streak) - 1), policy.pause_max_s)
    due = last.ended + pause
    if now >= due:
        return None
    return Decision(Step.WAIT, f"pausing {pause:g} s after the last {last.remedy.value} "
                    f"({last.outcome}) before the next attempt", retry_at=due)
