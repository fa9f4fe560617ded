"""The `fabric` check: NVLink fabric registration per GPU.

- a registration that completed with an error status is FABRIC_REGISTRATION_FAILED (ERR),
  and one run that sees it makes the node ERR (the Fabric Manager's final answer);
- a GPU not (yet) registered is a fault only once the node has been up past the grace;
- GPUs without a fabric (PCIe boards) are SKIPPED, never PASS.
"""

from __future__ import annotations

import pytest

from checks.base import Severity
from checks.fabric import FabricCheck
from checks.probes import Probes
from checks.snapshot import Fabric, Ok, Unsupported
from healthd.agent import verdict
from healthd.kube.conventions import Verdict

from .gpufakes import codes_by_gpu, context, entity_status, findings_on, healthy_gpu, node, run

pytestmark = pytest.mark.anyio


def booted_since(uptime_s: float, params: dict[str, object] | None = None) -> FabricCheck:
    """The check on a node that booted `uptime_s` ago."""
    return FabricCheck(params, probes=Probes(uptime=lambda: uptime_s))


def registered(state: str = "completed", status: str = "SUCCESS") -> Ok[Fabric]:
    return Ok(Fabric(state=state, status=status, clique_id=1))  # type: ignore[arg-type]


async def test_failed_registration_is_err_on_that_gpu() -> None:
    snap = node(healthy_gpu(0, fabric=registered()),
                healthy_gpu(3, fabric=registered(status="INSUFFICIENT_RESOURCES")))
    result = await run(booted_since(10.0), context(snap))
    assert codes_by_gpu(result) == {3: ["FABRIC_REGISTRATION_FAILED"]}
    assert findings_on(result, 3)[0].severity is Severity.ERR
    assert "INSUFFICIENT_RESOURCES" in findings_on(result, 3)[0].message
    assert entity_status(result, 0).status is Severity.PASS


async def test_one_run_that_sees_a_failed_registration_makes_the_node_err() -> None:
    snap = node(healthy_gpu(0, fabric=registered()),
                healthy_gpu(3, fabric=registered(status="INSUFFICIENT_RESOURCES")))
    result = await run(booted_since(10.0), context(snap))
    state = verdict.apply(verdict.initial(), "fabric", result,
                          trigger=verdict.Trigger.PERIODIC, at=1.0, policy=verdict.Policy())
    assert state.verdict is Verdict.ERR
    assert [(h.code, h.entity) for h in state.held] == [("FABRIC_REGISTRATION_FAILED", "gpu3")]


@pytest.mark.parametrize(("state", "code"), [("not_started", "FABRIC_NOT_STARTED"),
                                             ("in_progress", "FABRIC_IN_PROGRESS")])
async def test_unregistered_gpu_is_err_only_after_the_grace(state: str, code: str) -> None:
    snap = node(healthy_gpu(0, fabric=registered(state)))
    early = await run(booted_since(119.0, {"grace_s": 120}), context(snap))
    late = await run(booted_since(121.0, {"grace_s": 120}), context(snap))
    assert early.findings == () and early.status is Severity.PASS
    assert entity_status(early, 0).values["fabric_state"] == state
    assert codes_by_gpu(late) == {0: [code]}
    assert late.status is Severity.ERR


async def test_gpu_without_fabric_is_skipped() -> None:
    snap = node(healthy_gpu(0, fabric=Unsupported("no NVLink fabric")))
    result = await run(booted_since(9999.0), context(snap))
    assert result.status is Severity.SKIPPED
    assert result.findings == ()
