"""The reboot hand-off: healthd asks the cluster's remediation for a reboot with one
request made from the admin's template, follows the Node's boot id, deletes the
request and validates the node; a node that never reboots goes to humans. The fake
reboot operator (healthd.sim.remediation) reboots the simulated machine and reports
the new boot id, as Self Node Remediation and the kubelet do."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from healthd.config import Config
from healthd.sim.apiserver import ApiEmulator
from healthd.sim.machine import load_machine_spec
from tests.agent.harness import KEYS, NODE, eventually
from tests.controller.conftest import KubeFactory, Replica, controllers
from tests.controller_repairs.conftest import (
    BOOT_ID,
    SNR,
    SNR_NS,
    TEMPLATE,
    TEMPLATE_SPEC,
    Cluster,
    cluster,
    controller_config,
    hardware,
    holding_node,
    snr_template,
)

pytestmark = pytest.mark.anyio


REPAIR_S = 60.0  # a loose bound: a few check rounds and `healthd` subprocesses


def xid79_node() -> dict[str, object]:
    """A node its agent found XID 79 on (a reboot's finding), GPU 5."""
    return holding_node("XID_79", "xid", 5, "EVICT", sticky=True)


def attempts(c: Cluster) -> list[tuple[str, str]]:
    doc = c.repair()
    return [] if doc is None else [(a["remedy"], a["outcome"]) for a in doc["attempts"]]


def boot_id(c: Cluster) -> str:
    return str(c.node()["status"].get("nodeInfo", {}).get("bootID", ""))


async def test_a_gpu_off_the_bus_is_rebooted_by_the_remediation_validated_and_released(
        api: ApiEmulator, kube_for: KubeFactory, tmp_path: Path) -> None:
    async with cluster(api, kube_for, tmp_path, spec="xid79", reboots=True,
                       config=controller_config(reboot=TEMPLATE)) as c:
        await eventually(lambda: c.state() == "reboot-requested", 15, "a reboot requested")
        doc = c.repair()
        assert doc is not None and doc["boot_id"] == BOOT_ID
        assert doc["request"] == f"{SNR} {SNR_NS}/{NODE}"
        await eventually(lambda: c.agent.verdict() == "PASS" and c.state() == "", REPAIR_S,
                         "PASS again")

        assert c.operator is not None and c.operator.rebooted == [NODE]
        assert boot_id(c) != BOOT_ID
        assert attempts(c) == [("reboot", "passed")]
        assert c.requests_created() == 1 and c.requests() == []  # made once, then deleted
        last = c.agent.last_run()
        assert last is not None and last["id"] == "repair-1"
        await eventually(lambda: c.events("RepairSucceeded"), 5, "the Event")
        for reason in ("RebootRequested", "RebootDone", "RepairSucceeded"):
            assert len(c.events(reason)) == 1, reason
        assert c.metric("healthd_controller_repairs_total", action="reboot",
                        outcome="started") == 1
        assert c.metric("healthd_controller_repairs_total", action="reboot",
                        outcome="passed") == 1


async def test_the_request_is_made_from_the_template(
        api: ApiEmulator, kube_for: KubeFactory, tmp_path: Path) -> None:
    # No operator: the request stays, as the remediation would see it.
    async with cluster(api, kube_for, tmp_path, spec="xid79", template=True,
                       config=controller_config(reboot=TEMPLATE)) as c:
        await eventually(lambda: c.requests(), 15, "the request")
        (request,) = c.requests()
        assert request["apiVersion"] == "remediation.medik8s.io/v1alpha1"
        assert request["kind"] == SNR
        assert request["metadata"]["name"] == NODE
        assert request["metadata"]["namespace"] == SNR_NS
        assert request["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "healthd"}
        assert request["metadata"]["annotations"]["healthd.io/node-name"] == NODE
        assert request["spec"] == TEMPLATE_SPEC
        await eventually(lambda: "reboot requested" in (c.agent.condition() or {}).get(
            "message", ""), 15, "the condition says so")
        assert c.agent.verdict() == "EVICT"  # kept out meanwhile


async def test_a_fault_that_survives_resets_and_reboots_goes_to_hardware_inspection(
        api: ApiEmulator, kube_for: KubeFactory, tmp_path: Path) -> None:
    async with cluster(api, kube_for, tmp_path, reboots=True,
                       spec=hardware(load_machine_spec("remap-pending")),
                       config=controller_config(reboot=TEMPLATE, max_reboots=1)) as c:
        await eventually(lambda: c.state() == "hardware-inspection", 3 * REPAIR_S,
                         "to humans")
        assert attempts(c) == [("reset", "failed"), ("reset", "failed"),
                               ("reboot", "failed")]
        assert c.operator is not None and c.operator.rebooted == [NODE]
        assert c.requests_created() == 1 and c.requests() == []
        await eventually(lambda: c.events("HardwareInspection"), 5, "the Event")
        await anyio.sleep(1.0)
        assert c.requests_created() == 1 and len(c.kubelet.jobs_seen) == 2  # nothing more
        assert c.agent.verdict() == "ERR"  # kept out
        await eventually(lambda: "hardware inspection" in (c.agent.condition() or {}).get(
            "message", ""), 10, "the condition says so")


# -- without an agent: the node shows what an agent left on it (XID_79 held on GPU 5) ---


def repair_of(api: ApiEmulator) -> dict[str, object]:
    text = (api.get("Node", NODE)["metadata"].get("annotations") or {}).get(KEYS.repair)
    return json.loads(text) if text else {}


def events(api: ApiEmulator, reason: str) -> list[str]:
    return [e["message"] for e in api.list("Event") if e.get("reason") == reason]


def created(api: ApiEmulator) -> int:
    return len([r for r in api.writes("POST", r".*/selfnoderemediations") if r.status == 201])


@asynccontextmanager
async def leader(api: ApiEmulator, kube_for: KubeFactory, config: Config,
                 *seeds: dict[str, object], name: str = "ctl") -> AsyncIterator[Replica]:
    api.seed(*seeds)
    async with controllers(kube_for, config, name) as (replica,):
        yield replica


async def test_a_node_that_does_not_reboot_in_time_goes_to_hardware_inspection(
        api: ApiEmulator, kube_for: KubeFactory) -> None:
    config = controller_config(reboot=TEMPLATE, reboot_timeout="1s")
    async with leader(api, kube_for, config, xid79_node(), snr_template()) as ctl:
        await eventually(lambda: repair_of(api).get("state") == "hardware-inspection", 15,
                         "to humans")
        assert [(a["remedy"], a["outcome"]) for a in repair_of(api)["attempts"]] == [
            ("reboot", "timed-out")]
        assert created(api) == 1 and api.list(SNR, SNR_NS) == []  # withdrawn
        await eventually(lambda: events(api, "RebootTimedOut"), 5, "the Event")
        assert "did not reboot within 1 s" in events(api, "RebootTimedOut")[0]
        assert ctl.sample("healthd_controller_repairs_total",
                          {"action": "reboot", "outcome": "timed-out"}) == 1
        await eventually(lambda: ctl.sample(
            "healthd_controller_nodes_in_hardware_inspection") == 1, 5, "the gauge")
        await anyio.sleep(1.0)
        assert created(api) == 1  # nothing more


async def test_without_a_template_the_node_is_held_saying_a_reboot_is_needed(
        api: ApiEmulator, kube_for: KubeFactory) -> None:
    async with leader(api, kube_for, controller_config(), xid79_node(), snr_template()):
        await eventually(lambda: repair_of(api).get("state") == "held", 15, "held")
        assert str(repair_of(api)["reason"]).startswith("reboot needed: no reboot hand-off")
        await eventually(lambda: events(api, "RebootNeeded"), 5, "the Event")
        await anyio.sleep(0.5)
        assert created(api) == 0 and repair_of(api)["attempts"] == []


async def test_a_missing_template_holds_the_node_and_names_it(
        api: ApiEmulator, kube_for: KubeFactory) -> None:
    async with leader(api, kube_for, controller_config(reboot=TEMPLATE), xid79_node()):
        await eventually(lambda: repair_of(api).get("state") == "held", 15, "held")
        reason = str(repair_of(api)["reason"])
        assert reason.startswith("reboot needed: the remediation template "
                                 f"SelfNodeRemediationTemplate {SNR_NS}/automatic cannot be read")
        await eventually(lambda: events(api, "RebootRequestFailed"), 5, "the Event")
        assert "404" in events(api, "RebootRequestFailed")[0]
        await anyio.sleep(0.5)
        assert created(api) == 0 and repair_of(api)["attempts"] == []  # no budget spent


async def test_someone_elses_request_for_the_node_holds_it_and_is_left_alone(
        api: ApiEmulator, kube_for: KubeFactory) -> None:
    theirs = {"apiVersion": "remediation.medik8s.io/v1alpha1", "kind": SNR,
              "metadata": {"name": NODE, "namespace": SNR_NS}, "spec": {}}
    async with leader(api, kube_for, controller_config(reboot=TEMPLATE), xid79_node(),
                      snr_template(), theirs):
        await eventually(lambda: repair_of(api).get("state") == "held", 15, "held")
        assert "someone else is remediating the node" in str(repair_of(api)["reason"])
        await eventually(lambda: events(api, "RebootRequestFailed"), 5, "the Event")
        await anyio.sleep(0.5)
        assert created(api) == 0 and api.writes("DELETE", r".*/selfnoderemediations/.*") == []
        assert repair_of(api)["attempts"] == []


async def test_dry_run_requests_no_reboot(api: ApiEmulator, kube_for: KubeFactory) -> None:
    config = controller_config(reboot=TEMPLATE)
    config = config.model_copy(update={"controller": config.controller.model_copy(
        update={"dry_run": True})})
    async with leader(api, kube_for, config, xid79_node(), snr_template()) as ctl:
        await eventually(lambda: ctl.sample("healthd_controller_repairs_total", {
            "action": "reboot", "outcome": "dry-run"}) == 1, 15, "the decision counted")
        await anyio.sleep(0.5)
        assert created(api) == 0 and repair_of(api) == {}
        assert not events(api, "RebootRequested")


async def test_a_leader_killed_between_the_annotation_and_the_request_requests_once(
        api: ApiEmulator, kube_for: KubeFactory) -> None:
    api.fail("POST", r".*/selfnoderemediations", 500, times=100)  # never made by the first
    async with leader(api, kube_for, controller_config(reboot=TEMPLATE), xid79_node(),
                      snr_template()) as first:
        await eventually(lambda: repair_of(api).get("state") == "reboot-requested"
                         and events(api, "RebootRequested"), 15, "the attempt recorded")
        assert api.list(SNR, SNR_NS) == []
        first.stop()
    api.clear_faults()

    async with controllers(kube_for, controller_config(reboot=TEMPLATE), "ctl2"):
        await eventually(lambda: api.list(SNR, SNR_NS), 15, "made by the next leader")
        # The node comes back from its reboot: the kubelet reports a new boot id.
        node = api.get("Node", NODE)
        node["status"]["nodeInfo"]["bootID"] = "boot-2"
        api.put(node)
        await eventually(lambda: repair_of(api).get("state") == "validating", 15,
                         "validating")
        assert api.list(SNR, SNR_NS) == []  # the remediation may let the node go

    assert created(api) == 1
    assert [(a["remedy"], a["outcome"]) for a in repair_of(api)["attempts"]] == [
        ("reboot", "")]
    assert len(events(api, "RebootRequested")) == 1 and len(events(api, "RebootDone")) == 1
    annotations = api.get("Node", NODE)["metadata"]["annotations"]
    assert annotations[KEYS.run_id] == "repair-1" and annotations[KEYS.clear] == "true"


async def test_a_request_someone_else_made_meanwhile_holds_the_node_and_is_left_alone(
        api: ApiEmulator, kube_for: KubeFactory) -> None:
    theirs = {"apiVersion": "remediation.medik8s.io/v1alpha1", "kind": SNR,
              "metadata": {"name": NODE, "namespace": SNR_NS}, "spec": {}}
    api.fail("POST", r".*/selfnoderemediations", 500, times=100)  # ours is not made yet
    async with leader(api, kube_for, controller_config(reboot=TEMPLATE), xid79_node(),
                      snr_template()):
        await eventually(lambda: repair_of(api).get("state") == "reboot-requested", 15,
                         "the attempt recorded")
        api.seed(theirs)  # another remediator gets there first
        api.clear_faults()
        await eventually(lambda: repair_of(api).get("state") == "held", 15, "held")
        assert "someone else is remediating the node" in str(repair_of(api)["reason"])
        assert [(a["remedy"], a["outcome"]) for a in repair_of(api)["attempts"]] == [
            ("reboot", "failed")]
        await anyio.sleep(0.5)
        assert len([m for m in events(api, "RebootRequestFailed")
                    if "someone else is remediating" in m]) == 1  # said once
        assert created(api) == 0 and api.writes("DELETE", r".*/selfnoderemediations/.*") == []
        assert api.list(SNR, SNR_NS)[0]["metadata"].get("labels") in (None, {})


async def test_a_refused_request_is_said_once_and_made_when_the_api_accepts_it(
        api: ApiEmulator, kube_for: KubeFactory) -> None:
    api.fail("POST", r".*/selfnoderemediations", 403, times=1000)  # RBAC lacks the kind
    async with leader(api, kube_for, controller_config(reboot=TEMPLATE), xid79_node(),
                      snr_template()):
        await eventually(lambda: events(api, "RebootRequestFailed"), 15, "the Event")
        (said,) = events(api, "RebootRequestFailed")
        assert said.startswith(f"{SNR} {SNR_NS}/{NODE} could not be created: 403")
        assert repair_of(api).get("state") == "reboot-requested"  # the node stays out
        await anyio.sleep(6.0)  # past a retry (5 s): refused again, not said again
        assert len(events(api, "RebootRequestFailed")) == 1
        api.clear_faults()
        await eventually(lambda: api.list(SNR, SNR_NS), 15, "made once the API accepts it")
        assert created(api) == 1 and len(events(api, "RebootRequested")) == 1
