"""flapping: what three noisy signals do to the published node state.

Each signal is 1,000 rounds (`--quick`: 200) of one check's result about one entity,
fed to the real verdict machine, rendered by the real node view and written by the
real node publisher to the API emulator over HTTP; the emulator's request log
counts what a user and the API server would see:

- `blips`: a GPU's HW_SLOWDOWN clock reason shows on a random 1 round in 10 (a held
  WARN with an intermittent signal: its Node writes are the figure to watch);
- `oscillating`: a PCIe replay counter's rise per round swings around its
  threshold (a slow sine plus noise), reported as PCIE_REPLAYS when above it;
- `ping_loss`: one peer misses its ping on a random 1 round in 5 (PEER_UNREACHABLE).

Per signal: label changes, Node writes and Events for one seeded series; the
label changes of the same signal over `SEEDS` other series (mean, p90, max: a noisy
signal's first raise comes before it has swung much, so the count varies); the same
series through an undamped machine (every code raised at once, no doubling: the
rules before damping) for comparison; and the latencies damping must keep: runs
until a persistent fault is raised and until a persistent recovery is released,
from a fresh node (after a 10-run fault, and after a fault seen only twice: the
minimum hold) and from the node the noise left behind.

    python bench/flapping.py            # 1,000 rounds per signal
    python bench/flapping.py --quick    # 200 rounds per signal
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import anyio
from common import Goal, main, parser, percentile

from checks.base import CheckResult, Entity, ResultBuilder
from checks.catalog import AT_ONCE, Catalog, Override
from healthd.agent.node_status import NodePublisher
from healthd.agent.node_view import desired_from
from healthd.agent.verdict import HealthState, Policy, Trigger, apply, initial
from healthd.kube.backoff import Backoff
from healthd.kube.client import Kube
from healthd.kube.conventions import COMPONENT, Keys, Verdict
from healthd.kube.events import EventRecorder
from healthd.sim.apiserver import ApiEmulator

NAME = "flapping"
NODE = "bench-node"
KEYS = Keys()
SEED = 13
REPLAY_THRESHOLD = 100  # the pcie check's max_replay_rise in this benchmark
GOAL_LABEL_CHANGES_PER_1000 = 2.0
PERSISTENT_RUNS = 200  # runs of a persistent fault / recovery when measuring latency
SEEDS = 20  # series per signal for the spread of label changes (--quick: 5)


@dataclass(frozen=True)
class Signal:
    """One noisy signal: which check reports what about whom, and each round's reading
    (is the finding present, and its message)."""

    name: str
    check: str
    code: str
    entity: Entity
    reading: Callable[[int, random.Random], tuple[bool, str]]

    def result(self, present: bool, message: str, catalog: Catalog) -> CheckResult:
        builder = ResultBuilder(self.check, catalog)
        builder.seen(self.entity)
        if present:
            builder.finding(self.code, self.entity, message)
        return builder.build()


def _blip(n: int, rng: random.Random) -> tuple[bool, str]:
    clocks = 1980 - rng.randint(300, 600)
    return rng.random() < 0.1, f"HW slowdown: SM clock at {clocks} MHz"


def _oscillating(n: int, rng: random.Random) -> tuple[bool, str]:
    rise = REPLAY_THRESHOLD * (1 + 0.15 * math.sin(2 * math.pi * n / 23)) + rng.gauss(0, 12)
    return rise > REPLAY_THRESHOLD, f"PCIe replay counter rose by {int(rise)} since the last run"


def _ping_loss(n: int, rng: random.Random) -> tuple[bool, str]:
    return rng.random() < 0.2, f"n2 did not answer {rng.randint(1, 3)} of 3 pings"


def _gpu(index: int) -> Entity:
    """A GPU as the NVML pass reports it: index and UUID."""
    return Entity.gpu(index, uuid=f"GPU-{index:08d}-5a5a-4b4b-8c8c-0123456789ab")


SIGNALS = (
    Signal("blips", "power", "HW_SLOWDOWN", _gpu(0), _blip),
    Signal("oscillating", "pcie", "PCIE_REPLAYS", _gpu(1), _oscillating),
    Signal("ping_loss", "ping", "PEER_UNREACHABLE", Entity("peer", "n2"), _ping_loss),
)


def undamped(policy: Policy, code: str) -> Policy:
    """The rules before damping: raised on one sighting, never held longer."""
    catalog = Catalog({code: Override(raise_rule=AT_ONCE)})
    return Policy(recover_after=policy.recover_after, catalog=catalog, max_doublings=0,
                  min_hold=0)


def step(state: HealthState, signal: Signal, present: bool, message: str, at: float,
         policy: Policy) -> HealthState:
    result = signal.result(present, message, policy.catalog)
    return apply(state, signal.check, result, trigger=Trigger.PERIODIC, at=at, policy=policy)


def readings(signal: Signal, rounds: int, seed: int = SEED) -> list[tuple[bool, str]]:
    rng = random.Random(f"{seed}-{signal.name}")
    return [signal.reading(n, rng) for n in range(rounds)]


def verdicts(signal: Signal, series: list[tuple[bool, str]], policy: Policy,
             state: HealthState | None = None) -> tuple[list[Verdict], HealthState]:
    state = state or initial(0.0)
    out = []
    for n, (present, message) in enumerate(series, start=1):
        state = step(state, signal, present, message, float(n), policy)
        out.append(state.verdict)
    return out, state


def changes(labels: list[Verdict]) -> int:
    return sum(a is not b for a, b in pairwise([Verdict.PASS, *labels]))


def runs_until(signal: Signal, state: HealthState, present: bool, policy: Policy) -> int | None:
    """Runs of a persistent fault (`present`) or recovery until the verdict follows
    (0: it already does)."""
    wanted = (lambda v: v is not Verdict.PASS) if present else (lambda v: v is Verdict.PASS)
    if wanted(state.verdict):
        return 0
    for n in range(1, PERSISTENT_RUNS + 1):
        state = step(state, signal, present, "persistent", 1e6 + n, policy)
        if wanted(state.verdict):
            return n
    return None


def latencies(signal: Signal, noisy_end: HealthState, policy: Policy) -> dict[str, int | None]:
    faulty = [(True, "persistent")] * 10
    _, fresh_held = verdicts(signal, faulty, policy)
    _, noisy_held = verdicts(signal, faulty, policy, noisy_end)
    _, briefly_held = verdicts(signal, faulty[:2], policy)  # seen twice: just raised
    return {
        "raise_runs_fresh": runs_until(signal, initial(0.0), True, policy),
        "raise_runs_after_noise": runs_until(signal, noisy_end, True, policy),
        "release_runs_fresh": runs_until(signal, fresh_held, False, policy),
        "release_runs_after_two_sightings": runs_until(signal, briefly_held, False, policy),
        "release_runs_after_noise": runs_until(signal, noisy_held, False, policy),
    }


async def published(signal: Signal, series: list[tuple[bool, str]],
                    policy: Policy) -> dict[str, Any]:
    """Feed `series` through the real publisher; what the API server saw."""
    async with ApiEmulator() as api:
        api.seed({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        kube = Kube(api.async_client(), timeout_s=5)
        events = EventRecorder(kube, component=COMPONENT, host=NODE)
        publisher = NodePublisher(kube, NODE, KEYS, events,
                                  backoff=Backoff(initial=0.05, maximum=0.5))
        state = initial(0.0)
        labels: list[str] = []
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(publisher.run)
                for n, (present, message) in enumerate(series, start=1):
                    state = step(state, signal, present, message, float(n), policy)
                    publisher.want(desired_from(state, KEYS, node=NODE, dcgm_levels={}), state)
                    if not await publisher.flush(10):
                        raise RuntimeError(f"publisher out of sync: {publisher.last_error}")
                    label = (api.get("Node", NODE) or {})["metadata"]["labels"][KEYS.gpuhealth]
                    if not labels or labels[-1] != label:
                        labels.append(label)
                group.cancel_scope.cancel()
        finally:
            await kube.close()
        node_writes = api.writes(None, f"/api/v1/nodes/{NODE}(/status)?")
        posted = [r for r in api.writes("POST") if r.path.endswith("/events")]
        return {
            "label_changes": len(labels) - 1,  # the first label is the first judgement
            "node_writes": len(node_writes),
            "node_writes_after_first_round": max(0, len(node_writes) - 2),
            "events": len(posted) + len(api.writes("PATCH", r".*/events/.*")),
            "event_reasons": dict(Counter(str((r.body or {}).get("reason")) for r in posted)),
        }


def spread(signal: Signal, rounds: int, seeds: int, policy: Policy) -> dict[str, Any]:
    """Label changes per 1,000 rounds over `seeds` other series of the signal."""
    counts = sorted(changes(verdicts(signal, readings(signal, rounds, seed), policy)[0])
                    * 1000 / rounds for seed in range(seeds))
    return {"seeds": seeds, "mean": round(statistics.fmean(counts), 3),
            "p90": percentile(counts, 90), "max": counts[-1]}


def measure_signal(signal: Signal, rounds: int, seeds: int, policy: Policy) -> dict[str, Any]:
    series = readings(signal, rounds)
    damped, noisy_end = verdicts(signal, series, policy)
    before, _ = verdicts(signal, series, undamped(policy, signal.code))
    figures = {
        "rounds": rounds,
        "rounds_with_finding": sum(present for present, _ in series),
        "signal_changes": changes([Verdict.WARN if p else Verdict.PASS for p, _ in series]),
        **anyio.run(published, signal, series, policy),
        "label_changes_undamped": changes(before),
        "label_changes_per_1000_over_seeds": spread(signal, rounds, seeds, policy),
        "final_label": damped[-1].value,
        "flaps_total": noisy_end.flaps_total,
        **latencies(signal, noisy_end, policy),
    }
    assert figures["label_changes"] == changes(damped)  # the API saw what the machine said
    return figures


def measure(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Goal], list[str]]:
    rounds, seeds = (200, 5) if args.quick else (1000, SEEDS)
    policy = Policy()
    figures: dict[str, Any] = {
        "policy": {"recover_after": policy.recover_after, "raise_rule": "2 of 3, or 2 running",
                   "max_doublings": policy.max_doublings, "flap_window": policy.flap_window,
                   "min_hold": policy.min_hold},
        "release_bound_runs": policy.release_bound,
        "raise_bound_runs": 2,
    }
    goals: dict[str, Goal] = {}
    for signal in SIGNALS:
        result = measure_signal(signal, rounds, seeds, policy)
        figures[signal.name] = result
        per_1000 = result["label_changes"] * 1000 / rounds
        goals[f"{signal.name}_label_changes_per_1000"] = Goal(per_1000,
                                                              GOAL_LABEL_CHANGES_PER_1000)
        goals[f"{signal.name}_label_changes_per_1000_mean_over_seeds"] = Goal(
            result["label_changes_per_1000_over_seeds"]["mean"], GOAL_LABEL_CHANGES_PER_1000)
        worst_raise = max(result["raise_runs_fresh"] or PERSISTENT_RUNS + 1,
                          result["raise_runs_after_noise"] or 0)
        goals[f"{signal.name}_raise_runs"] = Goal(worst_raise, figures["raise_bound_runs"])
        # Writes only when the meaning changes: the first verdict and each label change
        # (a metadata and a condition patch each), plus a holding's flap count while it
        # grows (at most max_flaps updates of the annotation).
        goals[f"{signal.name}_node_writes"] = Goal(
            result["node_writes"], 2 * (result["label_changes"] + 1) + policy.max_flaps)
        release = result["release_runs_after_noise"]
        goals[f"{signal.name}_release_runs"] = Goal(
            release if release is not None else float(PERSISTENT_RUNS + 1),
            figures["release_bound_runs"])
    return figures, goals, [
        f"{rounds} rounds per signal, seed {SEED}; one check run per round; the node "
        "publisher writes to the API emulator over HTTP and the counts come from its "
        "request log",
        "raise runs after noise is 0 when the noise left the finding raised already",
    ]


if __name__ == "__main__":
    sys.exit(main(NAME, measure, parser(__doc__.splitlines()[0]).parse_args()))
