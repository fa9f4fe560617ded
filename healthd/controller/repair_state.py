"""The repair's pure half on the controller's side: what a node's objects say to the
decision (healthd.repair.decision), the next `repair` annotation for each step, the
validation request, and whether a validation passed.

Nothing here reads the API or the clock: the executor (healthd.controller.repairs)
passes the node as its cache holds it, and `now`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from healthd.config import Config
from healthd.config.controller import GpuOperatorSettings
from healthd.controller.reset_job import job_name
from healthd.kube.conventions import Keys
from healthd.kube.objects import annotations_of, labels_of, spec_of
from healthd.kube.shapes import Node, part
from healthd.published import (
    REPAIR_STATES,
    Health,
    Holding,
    LastRun,
    Repair,
    RepairAttempt,
    Undecodable,
    awaits_validation,
    dumps,
    read_health,
    read_last_run,
    read_repair,
)
from healthd.repair.decision import OPT_OUT_LABEL, Attempt, Policy, Remedy, Situation, findings_of
from healthd.requests import pointer
from healthd.util.times import parse_time, rfc3339

IDLE = ""
WAITING = "waiting"
HELD = "held"
RESETTING = "resetting"
VALIDATING = "validating"
REBOOT_REQUESTED = "reboot-requested"
INSPECTION = "hardware-inspection"
NOT_FAILING = frozenset({"PASS", "WARN", "SKIPPED"})  # a validation check that says so
RUN_ID_PREFIX = "repair-"
NEW_NODE_RUN_ID = "new-node"  # the validation of a node seen for the first time
NOTE_CHARS = 300  # of an attempt's outcome, in the record


@dataclass(frozen=True)
class NodeRepair:
    """One node's repair as its cached object shows it."""

    name: str
    repair: Repair  # an empty idle one when the node has none (or an unreadable one)
    raw: str | None  # the annotation's text as read: what a write's `test` guards
    held: tuple[Holding, ...]
    last_run: LastRun | None
    opted_out: bool
    cordoned: bool
    uid: str = ""  # names the node in Events (no read to find it)
    boot_id: str = ""  # status.nodeInfo.bootID: the kubelet's, new after each reboot
    new: bool = False  # never repaired nor judged before (published.awaits_validation)
    labels: Mapping[str, str] = field(default_factory=dict)
    released: str = ""  # the GPU-reset Job the node's agent let go of NVML for
    unreadable: str = ""  # why the annotation could not be read ("" : it could, or none)

    @property
    def state(self) -> str:
        return self.repair.state


def node_repair(node: Node, keys: Keys) -> NodeRepair:
    """What the node's labels, annotations and spec say about its repair."""
    annotations = annotations_of(node)
    repair = read_repair(node, keys)
    health = read_health(node, keys)
    last = read_last_run(node, keys)
    return NodeRepair(
        name=str(node.get("metadata", {}).get("name", "")),
        repair=repair if isinstance(repair, Repair) else Repair(IDLE, ""),
        raw=annotations.get(keys.repair),
        held=health.held if isinstance(health, Health) else (),
        last_run=last if isinstance(last, LastRun) else None,
        opted_out=labels_of(node).get(OPT_OUT_LABEL, "").lower() == "true",
        cordoned=spec_of(node).get("unschedulable") is True,
        uid=str(node.get("metadata", {}).get("uid", "")),
        boot_id=boot_id_of(node), new=awaits_validation(node, keys),
        labels=labels_of(node), released=annotations.get(keys.nvml_released, ""),
        unreadable=repair.why if isinstance(repair, Undecodable) else "")


def boot_id_of(node: Node) -> str:
    """The node's boot id as its kubelet reports it ("" when it reports none)."""
    info = part(part(node.get("status")).get("nodeInfo")).get("bootID")
    return info if isinstance(info, str) else ""


def rebooted(node: NodeRepair) -> bool:
    """Whether the node reports a boot id other than the one recorded with the request."""
    return bool(node.boot_id) and node.boot_id != node.repair.boot_id


def history(repair: Repair) -> tuple[Attempt, ...]:
    """The attempts the budget counts (unreadable entries left out)."""
    out = []
    for a in repair.attempts:
        at = parse_time(a.at)
        if at is not None and a.remedy in (Remedy.RESET, Remedy.REBOOT):
            out.append(Attempt(Remedy(a.remedy), at, a.gpus, a.outcome,
                               parse_time(a.ended), a.note))
    return tuple(out)


def situation(node: NodeRepair, *, now: float, pods_on_gpus: int,
              breaker_open: bool) -> Situation:
    """The decision's input. A cordon is someone else's: healthd never cordons."""
    return Situation(findings=findings_of(node.held), now=now, history=history(node.repair),
                     in_inspection=node.state == INSPECTION, pods_on_gpus=pods_on_gpus,
                     opted_out=node.opted_out, foreign_cordon=node.cordoned,
                     breaker_open=breaker_open)


def repaired(held: Iterable[Holding], policy: Policy) -> tuple[Holding, ...]:
    """The held findings a repair is for (those the remedy table names)."""
    return tuple(h for h in held if policy.remedy(h.code) is not None)


def first_since(held: Iterable[Holding]) -> float | None:
    """When the earliest of `held` was first held."""
    times = [t for h in held if (t := parse_time(h.since)) is not None]
    return min(times) if times else None


def admin_cleared(node: NodeRepair) -> bool:
    """An admin's clear (`healthd.io/clear=true`), answered by the agent after the node
    went to hardware inspection: humans say it is repaired."""
    last, since = node.last_run, parse_time(node.repair.since)
    if last is None or last.kind != "clear" or not last.accepted or since is None:
        return False
    started = parse_time(last.start)
    return started is not None and started > since


# -- the next annotation -----------------------------------------------------------------


def with_state(repair: Repair, state: str, reason: str, now: float,
               gpus: Sequence[str] = ()) -> Repair:
    """`repair` in `state` (no Job, no validation in flight), history kept."""
    return Repair(state=state, since=rfc3339(now), reason=reason, gpus=tuple(gpus),
                  attempts=repair.attempts)


def started_reset(repair: Repair, *, job: str, gpus: Sequence[str], reason: str,
                  now: float, held: Iterable[Holding],
                  operands: Mapping[str, str] | None = None) -> Repair:
    """A new reset attempt, its Job named before it is created; it remembers the
    checks that raised `held` (the findings it is for), which validate it, and the
    operand labels paused for it (`operands`, with the values to put back)."""
    attempt = RepairAttempt(Remedy.RESET.value, rfc3339(now), tuple(gpus), "")
    checks = tuple(dict.fromkeys(h.check for h in held if h.check))
    return Repair(state=RESETTING, since=rfc3339(now), reason=reason, gpus=tuple(gpus),
                  job=job, attempts=(*repair.attempts, attempt), checks=checks,
                  operands=dict(operands or {}))


def requested_reboot(repair: Repair, *, request: str, boot_id: str, reason: str,
                     now: float, held: Iterable[Holding]) -> Repair:
    """A new reboot attempt, its request named (and the boot id it must change from)
    before the request is created; it remembers the checks that raised `held`."""
    attempt = RepairAttempt(Remedy.REBOOT.value, rfc3339(now), (), "")
    checks = tuple(dict.fromkeys(h.check for h in held if h.check))
    return Repair(state=REBOOT_REQUESTED, since=rfc3339(now), reason=reason,
                  request=request, boot_id=boot_id, attempts=(*repair.attempts, attempt),
                  checks=checks)


def validating(repair: Repair, now: float, run_id: str = "") -> Repair:
    """The repair done (or a new node): the validation request in flight, under its run
    id (`repair-<attempt>` unless given)."""
    run_id = run_id or f"{RUN_ID_PREFIX}{len(repair.attempts)}"
    return replace(repair, state=VALIDATING, since=rfc3339(now), job="", started="",
                   request="", boot_id="", run_id=run_id, operands={})


def timed_out(repair: Repair, reason: str, now: float) -> Repair:
    """The reboot in flight never came: the attempt `timed-out`, the node to humans."""
    return replace(finished(repair, "timed-out", reason, now), state=INSPECTION)


def finished(repair: Repair, outcome: str, reason: str, now: float) -> Repair:
    """The attempt in flight ended with `outcome` (noted with the reason unless it
    passed); the node is idle again."""
    attempts = repair.attempts
    if attempts and not attempts[-1].outcome:
        note = "" if outcome == "passed" else reason[:NOTE_CHARS]
        attempts = (*attempts[:-1], replace(attempts[-1], outcome=outcome,
                                            ended=rfc3339(now), note=note))
    return Repair(state=IDLE, since=rfc3339(now), reason=reason, attempts=attempts)


# -- records the controller did not write ------------------------------------------------

# NVML's UUID syntax: GPU-8-4-4-4-12 hex digits (MIG-... for a MIG device).
GPU_UUID = re.compile(r"(GPU|MIG)-[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}")
CLOCK_SKEW_S = 300.0  # a `since` this far ahead of the controller's clock is not its own
IN_FLIGHT = {RESETTING: Remedy.RESET.value, REBOOT_REQUESTED: Remedy.REBOOT.value}


def refused_because(node: NodeRepair, *, namespace: str, now: float) -> str:
    """Why the node's repair record is not one the controller wrote ("" : it may be),
    checked against what the controller derives from its own history: a record
    anyone who may patch Nodes wrote must never start a privileged Job, hold a node
    TESTING or send it to humans."""
    if node.unreadable:
        return f"it cannot be read ({node.unreadable})"
    if node.raw is None:
        return ""
    repair = node.repair
    since = parse_time(repair.since)
    if repair.state not in REPAIR_STATES:
        return f"unknown state {repair.state[:40]!r}"
    if since is None:
        return "no time it was entered (since)"
    if since > now + CLOCK_SKEW_S:
        return f"it was entered in the future ({repair.since})"
    bad = [g for g in (*repair.gpus, *(u for a in repair.attempts for u in a.gpus))
           if not GPU_UUID.fullmatch(g)]
    if bad:
        return f"GPUs not named by UUID: {', '.join(repr(g[:40]) for g in bad[:3])}"
    return _history_problem(node, namespace)


def _history_problem(node: NodeRepair, namespace: str) -> str:
    """What in the record contradicts the steps the controller takes."""
    repair, attempts = node.repair, node.repair.attempts
    if any(a.remedy not in (Remedy.RESET.value, Remedy.REBOOT.value) for a in attempts):
        return "an attempt that is neither a reset nor a reboot"
    if any(not a.outcome for a in attempts[:-1]):
        return "an earlier attempt still in flight"
    remedy = IN_FLIGHT.get(repair.state)
    last = attempts[-1] if attempts else None
    if remedy is None:
        if last is not None and not last.outcome and repair.state != VALIDATING:
            return f"an attempt in flight in state {repair.state or 'idle'!r}"
        if repair.state == VALIDATING and repair.run_id not in (
                f"{RUN_ID_PREFIX}{len(attempts)}", NEW_NODE_RUN_ID):
            return f"a validation run id {repair.run_id[:40]!r} no attempt gives"
        return ""
    if last is None or last.outcome or last.remedy != remedy:
        return f"{repair.state} without its {remedy} attempt in flight"
    if repair.state == RESETTING:
        return _reset_problem(node, namespace)
    return ""


def _reset_problem(node: NodeRepair, namespace: str) -> str:
    repair = node.repair
    job = f"{namespace}/{job_name(node.name, len(repair.attempts))}"
    if repair.job != job:
        return f"a GPU-reset Job {repair.job[:80]!r} other than attempt " \
               f"{len(repair.attempts)}'s ({job})"
    held = {h.uuid for h in node.held if h.uuid}
    if not repair.gpus or not set(repair.gpus) <= held or \
            tuple(repair.gpus) != repair.attempts[-1].gpus:
        return "GPUs to reset that no finding held on the node names"
    return ""


def refused(repair: Repair, why: str, now: float) -> Repair:
    """What replaces a record the controller refuses: idle, saying why, with only the
    finished attempts that read as attempts (the budget they spent still counts)."""
    kept = tuple(a for a in repair.attempts if a.outcome and a.remedy in (
        Remedy.RESET.value, Remedy.REBOOT.value))
    return Repair(state=IDLE, since=rfc3339(now), reason=f"{REFUSED_RECORD}: {why}"[:500],
                  attempts=kept)


REFUSED_RECORD = "refused a repair record healthd did not write"


# -- the GPU Operator's operands ----------------------------------------------------------

PAUSED = "false"  # an operand label's value that removes its pod from the node


def operands_to_pause(labels: Mapping[str, str], settings: GpuOperatorSettings) -> dict[str, str]:
    """The operand labels to set to "false" before a reset, with the values found:
    those the node carries and are not "false" already (the operator's DaemonSets
    select on them; a label the node lacks runs no operand there). None when pausing
    is off."""
    if not settings.enabled:
        return {}
    return {k: labels[k] for k in settings.operands if k in labels and labels[k] != PAUSED}


def operand_labels(paused: Mapping[str, str], labels: Mapping[str, str], *,
                   restore: bool) -> dict[str, str]:
    """The label writes that pause (`restore=False`) or put back the operands: back to
    the value found, but only where the label still says "false" (an admin who set it
    meanwhile has the last word)."""
    if not restore:
        return {k: PAUSED for k in paused}
    return {k: v for k, v in paused.items() if labels.get(k) == PAUSED}


def validation_set(config: Config, repair: Repair) -> str:
    """What runs after a reset (a `healthd.io/run` value): the checks that raised the
    repaired findings, then the configured validation checks the agents' config
    enables; `all` should there be none."""
    keys = list(repair.checks)
    keys += [k for k in config.controller.repair.validation
             if config.check_section(k.partition(":")[0]).enabled]
    return ",".join(dict.fromkeys(keys)) or "all"


def validation_passed(last: LastRun, held: Iterable[Holding], policy: Policy) -> str:
    """"" when the validation passed, else why not: every check ran and none failed,
    and no finding a repair is for is held any more."""
    if not last.accepted:
        return f"the validation was refused: {last.error}"
    failing = sorted(k for k, status in last.checks.items() if status not in NOT_FAILING)
    if failing:
        return "validation failed: " + ", ".join(f"{k} {last.checks[k]}" for k in failing)
    left = repaired(held, policy)
    if left:
        return "still held after the repair: " + ", ".join(
            sorted({f"{h.code} on {h.entity}" for h in left}))
    return ""


# -- the write ---------------------------------------------------------------------------


def repair_ops(node: NodeRepair, new: Repair, keys: Keys,
               extra: dict[str, str] | None = None,
               labels: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """A JSON patch writing `new` only over the annotation as read (its text, or none),
    plus `extra` annotations (a request) and `labels` (the operands paused or put
    back: in the same write, so no leader can die between the two)."""
    path = pointer(keys.repair)
    # `null` tests that there is none yet (the API server's JSON patch reads an absent
    # member as null): no version test, which a cache that drops unchanged events
    # could hold stale for good. A node with findings to repair has annotations.
    ops: list[dict[str, Any]] = [{"op": "test", "path": path, "value": node.raw}]
    ops.append({"op": "add", "path": path, "value": dumps(new.to_json())})
    for key, value in (extra or {}).items():
        ops.append({"op": "add", "path": pointer(key), "value": value})
    if labels and not node.labels:  # a node without labels has no /metadata/labels
        ops.append({"op": "add", "path": "/metadata/labels", "value": {}})
    for key, value in (labels or {}).items():
        ops.append({"op": "add", "path": pointer(key, "labels"), "value": value})
    return ops
