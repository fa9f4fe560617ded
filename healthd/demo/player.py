"""Playing a scenario on the demo cluster: the steps in order, the expectations
judged against what the cluster shows, and a record of everything observed.

`Recorder` samples the cluster (healthd.demo.observe) and keeps the timeline of
states that changed, the Events and the step log; `Player.play()` brings the
cluster to its starting point (every node judged PASS, the controller leading
with synced caches, the scenario's AppWrappers Running), then runs each step no
earlier than its `at`. A `wait_for` that does not hold within its timeout (or
stops holding during its `for_s`) ends the story with a `Failure` that names the
step, the expectation and what was seen. Actions go through the API as an admin
would (merge patches, creates), or to the simulated hardware (faults, repairs).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio

from healthd.demo.cluster import DemoCluster, appwrapper_object
from healthd.demo.expect import describe, held_since, judge
from healthd.demo.observe import EventLog, State, changes, observe
from healthd.demo.scenario import Expect, Scenario, Step, measure
from healthd.kube.errors import KubeError
from healthd.kube.objects import APPWRAPPERS, NODES

SAMPLE_S = 0.1  # how often the cluster is read back
READY_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Failure:
    """Why a scenario failed: the step, what was expected, what was seen."""

    step: int  # -1: before the story (the cluster did not become ready)
    action: str
    expected: str
    seen: str

    def __str__(self) -> str:
        where = "setup" if self.step < 0 else f"step {self.step} ({self.action})"
        return f"{where}: expected {self.expected}; saw {self.seen}"


def action_text(step: Step) -> str:
    """What a step does, in a few words (`gpu-node-2 GPU 3: xid 79`)."""
    if step.wait_for is not None:
        return describe(step.wait_for)
    if step.fault is not None:
        fields = sorted(step.fault.hardware_fields())
        parts = ([f"xid {step.fault.xid}"] if step.fault.xid else []) + fields
        return f"{step.fault.node} GPU {step.fault.gpu}: {', '.join(parts)}"
    if step.link is not None:
        state = "back up" if step.link.up else "down"
        return f"{step.link.node} {step.link.network} link {state}"
    if step.repair is not None:
        gpu = "every GPU" if step.repair.gpu is None else f"GPU {step.repair.gpu}"
        return f"{step.repair.node} {gpu}"
    if step.annotate is not None or step.label is not None:
        node, values = (step.annotate.node, step.annotate.annotations) if step.annotate \
            else (step.label.node, step.label.labels)  # type: ignore[union-attr]
        return f"{node} " + " ".join(f"{k}={v}" if v is not None else f"{k}-"
                                     for k, v in values.items())
    if step.create_appwrapper is not None:
        aw = step.create_appwrapper
        return f"{aw.key} ({aw.pods} pods x {aw.gpus_per_pod} GPUs)"
    return str(step.cordon or step.uncordon or step.finish_appwrapper)


def machine_changes(step: Step, now: float) -> list[dict[str, Any]]:
    """A fault step as control-file commands (healthd.sim.control) at machine time
    `now`: written to the node's control file, every process on that machine (a
    GPU-reset Job's) finds the fault the agent finds."""
    assert step.fault is not None
    fault = step.fault.gpu_fault(now)
    out: list[dict[str, Any]] = []
    if fault is not None:
        out.append({"op": "inject", "fault": fault.model_dump(mode="json", exclude_unset=True)})
    if step.fault.xid is not None:
        out.append({"op": "emit_xid", "gpu": step.fault.gpu, "code": step.fault.xid})
    return out


@dataclass
class Recorder:
    """What was observed, with times in seconds since the story started."""

    cluster: DemoCluster
    on_line: Callable[[float, str], None] = lambda t, line: None
    start: float = field(default_factory=anyio.current_time)
    state: State | None = None
    timeline: list[dict[str, Any]] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    log: EventLog = field(default_factory=EventLog)
    marks: dict[str, float] = field(default_factory=dict)  # a step's mark -> its moment
    # Lines seen while the cluster is set up wait for `restart`, which prints them with
    # their times relative to the story's start (negative): the log never runs back.
    setup_lines: list[tuple[float, str]] | None = field(default_factory=list)

    def now(self) -> float:
        return anyio.current_time() - self.start

    def restart(self) -> None:
        """The story starts now: what was seen while setting up gets negative times."""
        shift = self.now()
        self.start += shift
        for t, text in self.setup_lines or ():
            self.on_line(t - shift, text)
        self.setup_lines = None
        self.on_line(0.0, "the cluster is ready: the story starts")
        for entry in (*self.timeline, *self.log.events):
            entry["t"] = round(entry["t"] - shift, 2)

    def sample(self) -> State:
        """Read the cluster; record (and report) what changed since the last read."""
        t = self.now()
        state = observe(self.cluster)
        if state != self.state:
            for line in changes(self.state, state):
                self._say(t, line)
            self.state = state
            self.timeline.append({"t": round(t, 2), "state": state})
        for event in self.log.collect(self.cluster, t):
            self._say(t, f"Event {event['type']} {event['reason']} on {event['object']}: "
                            f"{event['message']}")
        return state

    def _say(self, t: float, text: str) -> None:
        if self.setup_lines is not None:
            self.setup_lines.append((t, text))
        else:
            self.on_line(t, text)

    def step_started(self, index: int, step: Step) -> dict[str, Any]:
        """Log a step as it starts; the record is finished by `step_ended`."""
        t = self.now()
        what = action_text(step)
        record = {"t": round(t, 2), "index": index, "action": step.action, "what": what,
                  "note": step.note, "result": "running", "end": None}
        self.steps.append(record)
        text = " ".join(p for p in (f"step {index}: {step.action}", what) if p)
        self.on_line(t, f"{text}" + (f"  # {step.note}" if step.note else ""))
        return record

    def step_ended(self, record: dict[str, Any], failure: Failure | None) -> None:
        record["end"] = round(self.now(), 2)
        record["result"] = "failed" if failure else "done"
        if failure is not None:
            self.on_line(self.now(), f"FAILED {failure}")

    def mark(self, name: str, moment: float, timings: dict[str, tuple[str, str]]) -> None:
        """Step mark `name` reached at `moment` (story time); say so, and say every
        timing it ends."""
        self.marks[name] = round(moment, 2)
        first, start = next(iter(self.marks.items()))
        after = f" ({moment - start:+.2f} s after {first})" if name != first else ""
        self.on_line(self.now(), f"mark {name} at {moment:.2f} s{after}")
        done = measure({k: v for k, v in timings.items() if v[1] == name}, self.marks)
        for timing, seconds in done.items():
            start_mark, _ = timings[timing]
            self.on_line(self.now(), f"timing {timing}: {seconds:.2f} s "
                                     f"({start_mark} -> {name})")

    async def sample_forever(self) -> None:
        while True:
            self.sample()
            await anyio.sleep(SAMPLE_S)


class Player:
    """Plays `scenario` on `cluster`; see the module docstring."""

    def __init__(self, cluster: DemoCluster, scenario: Scenario, recorder: Recorder) -> None:
        self.cluster = cluster
        self.scenario = scenario
        self.rec = recorder

    async def play(self) -> Failure | None:
        """Set up, then run every step; the first failure ends the story."""
        failure = await self.setup()
        if failure is not None:
            return failure
        self.rec.restart()
        for index, step in enumerate(self.scenario.steps):
            await anyio.sleep_until(self.rec.start + step.at)
            record = self.rec.step_started(index, step)
            failure = await self.run_step(index, step)
            self.rec.step_ended(record, failure)
            if failure is not None:
                return failure
            if step.mark is not None:
                self.rec.mark(step.mark, self._moment(step, record), self.scenario.timings)
        return None

    def _moment(self, step: Step, record: dict[str, Any]) -> float:
        """When a step happened: an action when it ran, a wait_for since when what it
        waited for held (it may have come true while an earlier step waited)."""
        if step.wait_for is None:
            return float(record["t"])
        since = held_since(step.wait_for, self.rec.timeline, self.rec.log.events)
        return float(record["end"]) if since is None else since

    async def setup(self) -> Failure | None:
        for spec in self.scenario.appwrappers:
            try:
                await self.cluster.admin.create(APPWRAPPERS, appwrapper_object(spec))
            except KubeError as exc:
                return Failure(-1, "setup", f"AppWrapper {spec.key} created", str(exc))
        with anyio.move_on_after(READY_TIMEOUT_S):
            while (waiting := self._not_ready(self.rec.sample())):
                await anyio.sleep(SAMPLE_S)
            return None
        return Failure(-1, "setup", f"a ready cluster within {READY_TIMEOUT_S:.0f} s",
                       "; ".join(waiting))

    def _not_ready(self, state: State) -> list[str]:
        waiting = [f"{n} verdict {s['verdict'] or '(none)'}"
                   for n, s in state["nodes"].items() if s["verdict"] != "PASS"]
        term = self.cluster.controller.term
        if term is None or not term.caches.synced:
            waiting.append("the controller has not synced its caches")
        waiting += [f"AppWrapper {spec.key} {state['appwrappers'].get(spec.key, {})}"
                    for spec in self.scenario.appwrappers
                    if state["appwrappers"].get(spec.key, {}).get("phase") != "Running"]
        return waiting

    async def run_step(self, index: int, step: Step) -> Failure | None:
        if step.wait_for is not None:
            return await self.wait_for(index, step.wait_for)
        try:
            await self.act(step)
        except (KubeError, ValueError) as exc:
            return Failure(index, step.action, "the action to succeed", str(exc))
        return None

    async def act(self, step: Step) -> None:
        """Do what a step says (raises KubeError or ValueError when it cannot)."""
        admin = self.cluster.admin
        fleet = self.cluster.fleet
        if step.fault is not None:  # through the machine's control file: see `machine_changes`
            for command in machine_changes(step, fleet.nodes[step.fault.node].nvml.now()):
                fleet.change(step.fault.node, command)
        elif step.link is not None:
            fleet.network.set_link(step.link.node, step.link.network, step.link.up)
        elif step.repair is not None:
            fleet.change(step.repair.node, {"op": "clear_faults", "gpu": step.repair.gpu})
        elif step.annotate is not None:
            await admin.merge_patch(NODES, step.annotate.node,
                                    {"metadata": {"annotations": step.annotate.annotations}})
        elif step.label is not None:
            await admin.merge_patch(NODES, step.label.node,
                                    {"metadata": {"labels": step.label.labels}})
        elif step.cordon or step.uncordon:
            node = str(step.cordon or step.uncordon)
            await admin.merge_patch(NODES, node,
                                    {"spec": {"unschedulable": True if step.cordon else None}})
        elif step.create_appwrapper is not None:
            await admin.create(APPWRAPPERS, appwrapper_object(step.create_appwrapper))
        elif step.finish_appwrapper is not None:
            await self.cluster.operator.finish(step.finish_appwrapper)

    async def wait_for(self, index: int, expect: Expect) -> Failure | None:
        """Until `expect` holds (then for `for_s` more), or its timeout passes."""
        holds, seen = False, "nothing yet"
        with anyio.move_on_after(expect.timeout):
            while True:
                holds, seen = judge(expect, self.rec.sample(), self.rec.log.events)
                if holds:
                    break
                await anyio.sleep(SAMPLE_S)
        if not holds:
            return Failure(index, "wait_for", f"{describe(expect)} within {expect.timeout:g} s",
                           seen)
        end = anyio.current_time() + expect.for_s
        while anyio.current_time() < end:
            await anyio.sleep(SAMPLE_S)
            holds, seen = judge(expect, self.rec.sample(), self.rec.log.events)
            if not holds:
                return Failure(index, "wait_for", f"{describe(expect)} for {expect.for_s:g} s",
                               seen)
        return None
