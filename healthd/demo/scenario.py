"""The demo scenario: a YAML story of faults, admin actions and expectations.

A public format (documented in docs/scenarios.md). A scenario names the cluster
(node count, machine spec, config overrides, the AppWrappers running at the start)
and a timeline of steps. Each step has `at` (seconds after the story starts; a
step never runs earlier, and runs as soon as the step before it is done) and
exactly one action::

    steps:
      - {at: 2, fault: {node: gpu-node-2, gpu: 3, xid: 79}}
      - wait_for: {node: gpu-node-2, verdict: EVICT, timeout: 10}

A step may carry a `mark` (a name for its moment) and the scenario `timings`
between marks (`fault_to_pass: [fault, pass]`), measured on every run.

Models are frozen pydantic models; `load_scenario` turns every problem into a
`ScenarioError` naming the field (`steps.1.wait_for.verdict: ...`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, model_validator

from healthd.config import Config
from healthd.kube.conventions import GPU_RESOURCE, Verdict
from healthd.sim.machine import GpuFault, MachineSpecError, load_machine_spec
from healthd.util import bundled
from healthd.util.durations import Duration
from healthd.util.models import Frozen
from healthd.util.validation import explain

NAME = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
NODE_PREFIX = "gpu-node-"  # the simulated nodes are gpu-node-1..N
BUNDLED_DIR = Path(__file__).parent / "scenarios"
DEFAULT_SCENARIO = "fault-tolerance"
NVML_CHECKS = ("gpus", "remapped", "power", "pcie", "ecc", "nvlink", "xid")
OFF_CHECKS = ("pciebw", "ping", "pvc", "dcgm")

# The demo's healthd config: the real code paths with short clocks. NVML checks every
# second, recovery after 2 clean runs, the slow checks (which need a network, storage
# or DCGM) off, a breaker that tolerates half the nodes and closes after 3 s.
DEMO_CONFIG: dict[str, Any] = {
    "namespace": "healthd-system",
    "checks": {**{name: {"interval": 1} for name in NVML_CHECKS},
               **{name: {"enabled": False} for name in OFF_CHECKS}},
    "agent": {"recover_after": 2, "jitter": 0.0, "xid_window_s": 0.05, "api_timeout_s": 3,
              "shutdown_flush_s": 1},
    "controller": {
        "breaker": {"max_unhealthy": "50%", "window": "1m", "hold": "3s"},
        "resets": {"min_spacing": "30s"},
        "election": {"lease_duration": "3s", "renew_deadline": "2s", "retry_period": "200ms"},
    },
}


class ScenarioError(ValueError):
    """A scenario that cannot be played; the message names the field and the fix."""


def _exactly_one(model: BaseModel, fields: tuple[str, ...], what: str) -> None:
    given = [f for f in fields if getattr(model, f) is not None]
    if len(given) != 1:
        shown = ", ".join(given) if given else "none"
        raise ValueError(f"{what} needs exactly one of {', '.join(fields)} (got {shown})")


# -- actions --------------------------------------------------------------------------


class AppWrapperSpec(Frozen):
    """An AppWrapper of `pods` pods asking `gpus_per_pod` GPUs each."""

    name: str = Field(pattern=NAME, max_length=50)
    namespace: str = Field("blue", pattern=NAME)
    pods: int = Field(1, ge=1, le=64)
    gpus_per_pod: int = Field(8, ge=0, le=64)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


class FaultAction(GpuFault):
    """A fault on one GPU of one node, from now on: any GpuFault field of the machine
    spec (remapped_rows, ecc, nvlink_down, lost, ...), plus `xid` to deliver an XID
    event now and `for_s` to end the fault by itself."""

    node: str
    # One XID delivered now (the machine spec's `xid` is a schedule; not used here).
    xid: int | None = Field(  # type: ignore[assignment]
        None, ge=1, le=0xFFFF, description="deliver this XID now")
    for_s: float | None = Field(None, gt=0, description="the fault ends after this long")

    @model_validator(mode="after")
    def _times_from_the_step(self) -> FaultAction:
        if self.model_fields_set & {"at", "until"}:
            raise ValueError("at/until are not used here: the step's `at` says when, "
                             "`for_s` how long")
        if self.xid is None and not self.hardware_fields():
            raise ValueError("a fault needs `xid` or a GPU fault field "
                             "(e.g. remapped_rows: {pending: true})")
        return self

    def hardware_fields(self) -> set[str]:
        return self.model_fields_set - {"node", "gpu", "xid", "for_s"}

    def gpu_fault(self, now: float) -> GpuFault | None:
        """The machine fault to inject at machine time `now` (None: only an XID)."""
        if not self.hardware_fields():
            return None
        data = self.model_dump(include=self.hardware_fields() | {"gpu"})
        until = now + self.for_s if self.for_s else None
        return GpuFault.model_validate({**data, "at": now, "until": until})


class LinkAction(Frozen):
    """A node's simulated link on a network goes down (a dead NIC, cable or switch
    port) or comes back. The demo's nodes have the pod network `pod` and `net1`."""

    node: str
    network: Literal["pod", "net1"] = "net1"
    up: bool = False


class RepairAction(Frozen):
    """The GPU (or every GPU) of a node is repaired: its faults are cleared."""

    node: str
    gpu: int | None = Field(None, ge=0)


class AnnotateAction(Frozen):
    """`kubectl annotate node NODE key=value` (null removes the key)."""

    node: str
    annotations: dict[str, str | None] = Field(min_length=1)


class LabelAction(Frozen):
    """`kubectl label node NODE key=value` (null removes the key)."""

    node: str
    labels: dict[str, str | None] = Field(min_length=1)


# -- expectations ---------------------------------------------------------------------


class LendingExpect(Frozen):
    """A slack queue's lendingLimit for one resource; `value: null` = no field."""

    queue: str = "slack-cluster-queue"
    resource: str = GPU_RESOURCE
    flavor: str | None = Field(None, description="unset: the first flavor with the resource")
    value: int | str | None


class EventExpect(Frozen):
    """An Event with this reason (about `object`, of `type`, saying `message_contains`)."""

    reason: str
    object: str | None = Field(None, description="involvedObject name")
    type: Literal["Normal", "Warning"] | None = None
    message_contains: str | None = None


class LastRunExpect(Frozen):
    """The node's `healthd.io/last-run` answer."""

    accepted: bool
    request: str | None = None
    error_contains: str | None = None


_SUBJECTS = ("node", "appwrapper", "lending_limit", "event", "breaker_open")


class Expect(Frozen):
    """What must become true within `timeout` (and then stay true `for_s`)."""

    timeout: Duration = 30.0
    for_s: float = Field(0.0, ge=0, description="must then hold this long")
    node: str | None = None
    verdict: Verdict | None = None
    cordoned: bool | None = None
    finding: str | None = Field(None, description="a finding the node's health lists: "
                                "CODE or CODE@entity (NIC_DOWN@nic/net1)")
    blamed_on: list[str] | None = Field(None, description="exactly the networks the "
                                        "controller blames the node on ([] = none)")
    last_run: LastRunExpect | None = None
    appwrapper: str | None = Field(None, pattern=r"^[^/]+/[^/]+$", description="ns/name")
    phase: str | None = None
    on_nodes: list[str] | None = Field(None, description="its pods run on exactly these")
    not_on: list[str] | None = Field(None, description="none of its pods runs on these")
    lending_limit: LendingExpect | None = None
    event: EventExpect | None = None
    breaker_open: bool | None = None

    @model_validator(mode="after")
    def _one_subject(self) -> Expect:
        _exactly_one(self, _SUBJECTS, "wait_for")
        asked = (self.verdict, self.cordoned, self.last_run, self.finding, self.blamed_on)
        if self.node is not None and asked == (None,) * 5:
            raise ValueError("wait_for a node needs verdict, cordoned, last_run, finding "
                             "or blamed_on")
        if self.appwrapper is not None and \
                (self.phase, self.on_nodes, self.not_on) == (None,) * 3:
            raise ValueError("wait_for an appwrapper needs phase, on_nodes or not_on")
        return self

    def nodes_named(self) -> list[str]:
        return [n for n in [self.node, *(self.on_nodes or []), *(self.not_on or [])] if n]


_ACTIONS = ("fault", "link", "repair", "annotate", "label", "cordon", "uncordon",
            "create_appwrapper", "finish_appwrapper", "wait_for")


class Step(Frozen):
    """One step of the timeline: `at` and exactly one action (`note` narrates it)."""

    at: float = Field(0.0, ge=0, description="seconds after the story starts")
    note: str | None = None
    fault: FaultAction | None = None
    link: LinkAction | None = None
    repair: RepairAction | None = None
    annotate: AnnotateAction | None = None
    label: LabelAction | None = None
    cordon: str | None = None
    uncordon: str | None = None
    create_appwrapper: AppWrapperSpec | None = None
    finish_appwrapper: str | None = Field(None, pattern=r"^[^/]+/[^/]+$")
    wait_for: Expect | None = None
    mark: str | None = Field(None, pattern=NAME, max_length=40,
                             description="names the moment of this step for `timings`: an "
                             "action's start, or since when what a wait_for waits for held")

    @model_validator(mode="after")
    def _one_action(self) -> Step:
        _exactly_one(self, _ACTIONS, "a step")
        return self

    @property
    def action(self) -> str:
        return next(a for a in _ACTIONS if getattr(self, a) is not None)

    def nodes_named(self) -> list[str]:
        """The nodes this step names (to check them against the cluster)."""
        if self.wait_for is not None:
            return self.wait_for.nodes_named()
        if self.cordon or self.uncordon:
            return [str(self.cordon or self.uncordon)]
        node = getattr(getattr(self, self.action), "node", None)
        return [node] if isinstance(node, str) else []


class Scenario(Frozen):
    """A demo story: the cluster, then the timeline."""

    name: str = Field(pattern=NAME)
    description: str = ""
    nodes: int = Field(3, ge=1, le=64, description="simulated GPU nodes gpu-node-1..N")
    min_nodes: int | None = Field(
        None, ge=1, le=64,
        description="the fewest nodes the story works on, when that is more than the "
                    "highest node its steps name (a reset job needs somewhere to go)")
    machine: str = Field("healthy-8xh100", description="machine spec of every node")
    config: dict[str, Any] = Field({}, description="healthd config merged over the demo's")
    appwrappers: list[AppWrapperSpec] = Field([], description="running when the story starts")
    steps: list[Step] = Field(min_length=1)
    time_limit: Duration = Field(120.0, description="the whole story must end within this")
    timings: dict[str, tuple[str, str]] = Field(
        {}, description="name -> [from mark, to mark]: measured each run, in the result")

    @model_validator(mode="after")
    def _unique_appwrappers(self) -> Scenario:
        keys = [aw.key for aw in self.appwrappers]
        dupes = sorted({k for k in keys if keys.count(k) > 1})
        if dupes:
            raise ValueError(f"appwrappers: {', '.join(dupes)} listed twice")
        return self

    @model_validator(mode="after")
    def _timings_between_marks(self) -> Scenario:
        marks = [step.mark for step in self.steps if step.mark]
        dupes = sorted({m for m in marks if marks.count(m) > 1})
        if dupes:
            raise ValueError(f"steps: mark {', '.join(dupes)} given twice")
        for name, (start, end) in self.timings.items():
            unknown = [m for m in (start, end) if m not in marks]
            if unknown:
                raise ValueError(f"timings.{name}: no step is marked {', '.join(unknown)} "
                                 f"(marks: {', '.join(marks) or 'none'})")
            if marks.index(start) >= marks.index(end):
                raise ValueError(f"timings.{name}: mark {start} must come before {end}")
        return self

    @model_validator(mode="after")
    def _plays_on_its_own_nodes(self) -> Scenario:
        if self.min_nodes is not None and self.min_nodes > self.nodes:
            raise ValueError(f"min_nodes ({self.min_nodes}) cannot exceed nodes "
                             f"({self.nodes})")
        return self


# -- loading --------------------------------------------------------------------------


def node_names(count: int) -> list[str]:
    return [f"{NODE_PREFIX}{i}" for i in range(1, count + 1)]


def bundled_scenarios() -> list[str]:
    return bundled.names(BUNDLED_DIR)


def resolve(source: str | Path) -> Path:
    """A path as given, or a bundled scenario by name (`fault-tolerance`)."""
    return bundled.resolve(source, BUNDLED_DIR)


def load_scenario(source: str | Path = DEFAULT_SCENARIO) -> Scenario:
    """Read and validate a scenario (a YAML file or a bundled name)."""
    try:
        path, raw = bundled.read_yaml(source, BUNDLED_DIR, "scenario")
    except bundled.UnreadableFile as exc:
        raise ScenarioError(str(exc)) from exc
    return parse_scenario(raw, origin=str(path))


def parse_scenario(raw: object, origin: str = "<scenario>") -> Scenario:
    if not isinstance(raw, dict):
        raise ScenarioError(f"scenario {origin}: expected a mapping at the top level")
    try:
        scenario = Scenario.model_validate(raw)
    except ValidationError as exc:
        raise ScenarioError(f"scenario {origin}: {explain(exc)}") from exc
    try:
        load_machine_spec(scenario.machine)
    except MachineSpecError as exc:
        raise ScenarioError(f"scenario {origin}: machine: {exc}") from exc
    return scenario


def minimum_nodes(scenario: Scenario) -> tuple[int, str]:
    """The fewest nodes `scenario` can be played on, and why: the highest-numbered
    node its steps name (`gpu-node-3` needs 3), or its `min_nodes` when larger."""
    least, why = 1, "any cluster has a node"
    for step in scenario.steps:
        for name in step.nodes_named():
            number = re.fullmatch(rf"{NODE_PREFIX}([1-9][0-9]*)", name)
            if number and int(number[1]) > least:
                least, why = int(number[1]), f"its steps name {name}"
    if scenario.min_nodes is not None and scenario.min_nodes > least:
        least, why = scenario.min_nodes, f"its min_nodes: {scenario.min_nodes}"
    return least, why


def check_fits(scenario: Scenario, nodes: int, origin: str = "") -> None:
    """Every node a step names exists among `nodes` simulated nodes."""
    known = set(node_names(nodes))
    for index, step in enumerate(scenario.steps):
        for name in step.nodes_named():
            if name not in known:
                raise ScenarioError(
                    f"scenario {origin or scenario.name}: steps.{index}.{step.action}: no node "
                    f"{name!r} in a {nodes}-node cluster (gpu-node-1..gpu-node-{nodes})")


def measure(timings: dict[str, tuple[str, str]], marks: dict[str, float]) -> dict[str, float]:
    """Each timing whose two marks were reached: seconds from the first to the second."""
    return {name: round(marks[end] - marks[start], 2)
            for name, (start, end) in timings.items() if start in marks and end in marks}


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Deep merge of two config mappings (`over` wins)."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def build_config(scenario: Scenario) -> Config:
    """The healthd config of the demo cluster: DEMO_CONFIG with the scenario's."""
    try:
        return Config.model_validate(merge(DEMO_CONFIG, scenario.config))
    except ValidationError as exc:
        raise ScenarioError(f"scenario {scenario.name}: config: {explain(exc)}") from exc
