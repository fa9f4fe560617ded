"""Annotations anyone with node-patch rights can write, written with garbage: the
agent replaces what it owns with its own state and keeps running (a deeply nested
JSON value once made it exit with a RecursionError while decoding)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from healthd.sim.apiserver import ApiEmulator
from tests.agent.harness import KEYS, eventually, running_agent

pytestmark = pytest.mark.anyio

# 100 kB each: two fit in the API server's 256 KiB for all of a Node's annotations.
NESTED = "[" * 50_000 + "]" * 50_000  # valid JSON, far deeper than any decoder recurses
GARBAGE = [NESTED, '{"verdict":' * 9_000, "x" * 100_000]


def ours(text: str | None) -> bool:
    """Whether the health annotation is the agent's own JSON again."""
    try:
        return isinstance(json.loads(text or ""), dict) and "verdict" in json.loads(text or "")
    except (ValueError, RecursionError):
        return False


@pytest.mark.parametrize("garbage", GARBAGE, ids=["nested", "unterminated", "large"])
async def test_garbage_in_the_health_annotation_is_replaced_and_the_agent_keeps_running(
        api: ApiEmulator, tmp_path: Path, garbage: str) -> None:
    async with running_agent(api, tmp_path) as h:
        await eventually(lambda: ours(h.annotations().get(KEYS.health)), 10, "first health")
        h.annotate(**{KEYS.health: garbage})
        await eventually(lambda: ours(h.annotations().get(KEYS.health)), 10,
                         "the agent's own health back")
        h.annotate(**{KEYS.health: garbage, KEYS.last_run: garbage})  # twice, and last-run
        await eventually(lambda: ours(h.annotations().get(KEYS.health)), 10,
                         "the agent's own health back again")
        h.sim.nvml.emit_xid(3, 79)  # still judging and publishing
        await eventually(lambda: h.verdict() == "EVICT", 10, "EVICT after an XID 79")
        assert h.agent.healthy()[0]
