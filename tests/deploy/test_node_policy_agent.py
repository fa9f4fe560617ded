"""The admission policy admits every write the real agent makes: its first verdict and
condition, a raised and a sticky fault, an on-demand request it consumes and answers,
a clear, and letting go of NVML for a GPU reset and taking it up again. The writes are
the agent's own, caught at the API emulator's store as (old Node, new Node), and
judged with the CEL runtime as the API server would."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from healthd.published import Repair
from healthd.sim.apiserver import ApiEmulator
from healthd.sim.apiserver.store import Store
from healthd.sim.apiserver.testing import api  # noqa: F401
from healthd.sim.machine import GpuFault, RemappedRowsFault
from tests.agent.harness import KEYS, NODE, eventually, running_agent
from tests.deploy.admission import Policy
from tests.deploy.manifests import AGENT
from tests.deploy.node_policy_cases import NODE_NAME_EXTRA, node
from tests.deploy.test_node_policy import policy  # noqa: F401

pytestmark = pytest.mark.anyio
Obj = dict[str, Any]


@pytest.fixture
def node_writes(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[Obj, Obj]]]:
    """(old, new) of every Node PATCH or PUT the store applies."""
    caught: list[tuple[Obj, Obj]] = []
    for method in ("patch", "replace"):
        original = getattr(Store, method)

        def catching(self: Store, rt: Any, namespace: str, name: str, *args: Any,
                     _original: Any = original, **kwargs: Any) -> Obj:
            old = self.get(rt, namespace, name) if rt.kind == "Node" else None
            new = _original(self, rt, namespace, name, *args, **kwargs)
            if old is not None:
                caught.append((old, new))
            return new

        monkeypatch.setattr(Store, method, catching)
    yield caught


async def test_every_write_of_the_real_agent_is_admitted(
    api: ApiEmulator, tmp_path: Path, node_writes: list[tuple[Obj, Obj]],  # noqa: F811
    policy: Policy,  # noqa: F811
) -> None:
    seeded = node()
    seeded["metadata"]["name"] = NODE
    api.seed(seeded)
    async with running_agent(api, tmp_path, seed=False) as h:
        await eventually(lambda: h.verdict() == "PASS", 10, "first verdict")
        h.sim.nvml.inject(GpuFault(gpu=2, remapped_rows=RemappedRowsFault(pending=True)))
        await eventually(lambda: h.verdict() == "ERR", 10, "ERR")
        h.request("remapped", run_id="r-1")
        await eventually(lambda: (h.last_run() or {}).get("id") == "r-1", 10, "answer")
        h.sim.nvml.emit_xid(5, 79)
        await eventually(lambda: h.verdict() == "EVICT", 10, "EVICT")
        h.sim.nvml.clear_faults()
        h.annotate(**{KEYS.clear: "true"})
        await eventually(lambda: KEYS.clear not in h.annotations(), 10, "clear consumed")
        await eventually(lambda: h.verdict() == "PASS", 10, "cleared")
        h.annotate(**{KEYS.repair: Repair("resetting", "2026-01-01T00:00:00Z",
                                          job="healthd-system-repair/reset-1").encode()})
        await eventually(lambda: KEYS.nvml_released in h.annotations(), 10, "NVML released")
        h.annotate(**{KEYS.repair: Repair("validating", "2026-01-01T00:00:00Z").encode()})
        await eventually(lambda: KEYS.nvml_released not in h.annotations(), 10, "NVML in use")
    assert len(node_writes) >= 8
    extra = {NODE_NAME_EXTRA: [NODE]}
    for old, new in node_writes:
        verdict = policy.review(old=old, new=new, user=AGENT, extra=extra)
        assert verdict.judged and verdict.allowed, (verdict.denials, old, new)
