"""Runs the ping check as one node of the fabric sees it, and prints what its agent
would publish. Started as `ip netns exec <host> python -m tests.network.ping_in_netns`
(so its ICMP sockets live in that host's namespace) with JSON on stdin:
`{"node": ..., "peers": [{"name", "addresses", "networks"}], "params": {...}}`.
Runs two rounds (a finding is held, and so published, on its second sighting).
Prints JSON for the last round: `findings` as (code, entity label) pairs, and `ping`,
the published view.
"""

from __future__ import annotations

import json
import sys

import anyio

from checks.base import CheckContext, Peer, run_check
from checks.catalog import Catalog
from checks.ping import PingCheck
from healthd.agent import verdict as v
from healthd.agent.node_view import ping_view


async def main() -> None:
    given = json.load(sys.stdin)
    peers = [Peer(p["name"], p["addresses"], p["networks"]) for p in given["peers"]]
    ctx = CheckContext(catalog=Catalog(), node_name=given["node"], peers=peers)
    state = v.initial()
    for at in (1.0, 2.0):
        result = await run_check(PingCheck(given["params"]), ctx, timeout_s=30)
        state = v.apply(state, "ping", result, trigger=v.Trigger.PERIODIC, at=at,
                        policy=v.Policy())
    json.dump({"status": result.status.value, "reason": result.reason,
               "findings": [[f.code, f.entity.label] for f in result.findings],
               "ping": (view := ping_view(state)) and view.to_json()}, sys.stdout)


if __name__ == "__main__":
    anyio.run(main)
