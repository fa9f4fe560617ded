"""`healthd status` shows the fleet network blame from the API alone, judged as the
controller judges it: the blamed node's row says so (JSON `blamed`, table column
BLAMED), the controller view names it, an isolated node is named apart, a partition
is flagged with nobody blamed; a selector narrows the rows, never the judgement."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from healthd.cli import build_parser
from healthd.fleet.command import status_command
from healthd.sim.apiserver import ApiEmulator
from tests.blame.conftest import agent_node, silent_node

pytestmark = pytest.mark.anyio

NODES = [f"n{i}" for i in range(1, 7)]


async def table(api: ApiEmulator, tmp_path: Path, *args: str) -> str:
    """`healthd status ARGS` against the emulator, in process: what it prints."""
    kubeconfig = api.write_kubeconfig(tmp_path / "admin.kubeconfig")
    parsed = build_parser().parse_args(["status", *args, "--kubeconfig", str(kubeconfig)])
    out = io.StringIO()
    assert await status_command(parsed, out=out) == 0
    return out.getvalue()


async def status(api: ApiEmulator, tmp_path: Path, *args: str) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(await table(api, tmp_path, "--output", "json", *args))
    return parsed


def one_down_one_cut_off(api: ApiEmulator) -> None:
    """n3 is down (no report, everyone misses it); n5 is cut off (says so)."""
    api.seed(silent_node("n3"), agent_node("n5", NODES, isolated=True),
             agent_node("n1", NODES, unreached=["n3", "n5"], labels={"rack": "r1"}),
             *(agent_node(n, NODES, unreached=["n3", "n5"])
               for n in NODES if n not in ("n1", "n3", "n5")))

async def test_status_shows_the_blamed_node(api: ApiEmulator, tmp_path: Path) -> None:
    one_down_one_cut_off(api)
    doc = await status(api, tmp_path)
    assert {r["name"]: r["blamed"] for r in doc["nodes"]} == {
        "n1": False, "n2": False, "n3": True, "n4": False, "n5": False, "n6": False}
    assert doc["controller"]["network"] == {
        "reporters": 5, "blamed": ["n3"], "isolated": ["n5"], "partitioned": False,
        "why": ""}

    narrowed = await status(api, tmp_path, "--selector", "rack=r1")
    assert [r["name"] for r in narrowed["nodes"]] == ["n1"]
    assert narrowed["controller"]["network"]["blamed"] == ["n3"]

    text = await table(api, tmp_path)
    lines = text.splitlines()
    header = lines[0].split()
    column = header.index("BLAMED") - 1  # "TOP CODES" is two words
    row = next(line.split() for line in lines if line.startswith("n3 "))
    assert row[column] == "yes"
    assert "network: 5 nodes report ping; blamed by their peers: n3; isolated: n5" in text


async def test_status_flags_a_partition_and_blames_nobody(api: ApiEmulator,
                                                          tmp_path: Path) -> None:
    left, right = NODES[:3], NODES[3:]
    api.seed(*(agent_node(n, NODES, unreached=right if n in left else left) for n in NODES))
    doc = await status(api, tmp_path)
    assert not any(r["blamed"] for r in doc["nodes"])
    network = doc["controller"]["network"]
    assert network["partitioned"] and network["blamed"] == []
    assert "2 groups" in network["why"]
    text = await table(api, tmp_path)
    assert "PARTITIONED" in text and "nobody blamed" in text


async def test_status_without_ping_reports(api: ApiEmulator, tmp_path: Path) -> None:
    api.seed(silent_node("n1"))
    doc = await status(api, tmp_path)
    assert doc["nodes"][0]["blamed"] is False
    assert doc["controller"]["network"]["reporters"] == 0
    assert "network: no node publishes ping results" in await table(api, tmp_path)
