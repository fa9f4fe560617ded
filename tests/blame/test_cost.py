"""What one recomputation costs the controller on a 2,000-node fleet: reading every
node's ping report from its annotation and judging them, with three unreached
entries (one flaky link seen three times) and with one node down. The time is
printed, never asserted; the result is."""

from __future__ import annotations

import json
import time

from healthd.blame.networks import Assessment, assess, rows_of
from tests.controller.conftest import KEYS, Obj, node

FLEET = [f"gpu-{i:04d}" for i in range(2000)]


def reporting(name: str, unreached: list[str]) -> Obj:
    obj = node(name)
    obj["metadata"]["annotations"][KEYS.health] = json.dumps(
        {"verdict": "PASS", "ping": {"isolated": False, "unreached": unreached}})
    return obj


def recompute(nodes: list[Obj], what: str) -> Assessment:
    start = time.perf_counter()
    found = assess(rows_of(nodes, KEYS))
    print(f"\n{what}: read and judged in {(time.perf_counter() - start) * 1000:.1f} ms")
    return found


def test_three_unreached_entries_blame_nobody() -> None:
    nodes = [reporting(n, [FLEET[0]] if n in FLEET[1:4] else []) for n in FLEET]
    found = recompute(nodes, "2,000 nodes, 3 unreached entries")
    assert found.reporters == 2000 and not found.blamed and not found.partitioned


def test_one_node_down_among_two_thousand() -> None:
    nodes = [node(FLEET[0])] + [reporting(n, [FLEET[0]]) for n in FLEET[1:]]
    found = recompute(nodes, "2,000 nodes, one down (1,999 unreached entries)")
    assert list(found.blamed) == [FLEET[0]] and len(found.blamed[FLEET[0]]) == 1999
