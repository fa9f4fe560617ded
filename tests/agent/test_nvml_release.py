"""The agent lets go of NVML while the controller resets its node's GPUs, as the Node
and the simulated machine show it: a `resetting` repair record makes the agent end its
NVML session and XID event set (the fake NVML library says what the process holds,
never the agent), then publish `healthd.io/nvml-released` with the record's Job; in
the gap no NVML check passes or releases a held finding and the node stays TESTING;
when the record moves on, the annotation goes, NVML is read again and what happened
in the gap is found (an XID from the kernel log, a fault, a new NVML XID). A record in
any other state, or one that cannot be read, releases nothing, and a release a killed
agent left goes once the record has moved on. An agent process started during a reset
never opens NVML, not even before it can read its Node."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from healthd.published import Repair
from healthd.sim.apiserver import ApiEmulator
from healthd.sim.holders import Sessions, nvml_sessions
from healthd.sim.machine import GpuFault, RemappedRowsFault
from tests.agent.harness import (
    KEYS,
    NODE,
    Harness,
    eventually,
    node_object,
    running_agent,
    scraped,
)
from tests.agent.test_process import HEALTHD, clean_env
from tests.realcluster.processes import free_port

pytestmark = pytest.mark.anyio

JOB = "healthd-system-repair/healthd-gpu-reset-gpu-node-1-1"
RELEASED = "NVML released for a GPU reset"
GAP_RUNS = 8  # runs of a check in the gap: past min_hold (6) and recover_after (2)
# GPU 5 of a simulated 8-GPU machine sits on bus 0x68 (00000000:68:00.0).
XID79_GPU5 = ("NVRM: Xid (PCI:0000:68:00): 79, pid='<unknown>', name=<unknown>, "
              "GPU has fallen off the bus.")


def record(state: str, job: str = "") -> str:
    """The controller's repair record in `state`."""
    return Repair(state, "2026-01-01T00:00:00Z", gpus=("GPU-3",), job=job).encode()


def released(h: Harness) -> str | None:
    return h.annotations().get(KEYS.nvml_released)


def health(h: Harness) -> dict[str, Any]:
    return dict(json.loads(h.annotations()[KEYS.health]))


def held(h: Harness) -> set[tuple[str, str]]:
    return {(item["code"], item["entity"]) for item in health(h)["held"]}


def runs(h: Harness, check: str, result: str) -> float:
    return h.metric("healthd_check_runs_total", node=NODE, check=check, result=result) or 0.0


async def gap_runs(h: Harness, check: str = "remapped") -> None:
    """Until `check` has run GAP_RUNS more times, each UNKNOWN."""
    before = runs(h, check, "UNKNOWN")
    await eventually(lambda: runs(h, check, "UNKNOWN") >= before + GAP_RUNS, 15,
                     f"{GAP_RUNS} runs of {check} in the gap")


async def test_a_resetting_record_makes_the_agent_let_go_of_nvml_and_say_so(
        api: ApiEmulator, tmp_path: Path) -> None:
    async with running_agent(api, tmp_path) as h:
        await h.judged()
        assert h.verdict() == "PASS" and h.sim.nvml.sessions().holding

        h.annotate(**{KEYS.repair: record("resetting", JOB)})
        await eventually(lambda: released(h) == JOB, 10, "the release published")
        gone = h.sim.nvml.sessions()
        assert not gone.holding  # no session and no event set when the Node says so

        passes = runs(h, "remapped", "PASS")
        await gap_runs(h)
        assert h.sim.nvml.sessions() == gone  # not one nvmlInit in the gap
        assert runs(h, "remapped", "PASS") == passes
        checks = health(h)["checks"]
        for name in ("gpus", "remapped", "power", "pcie", "ecc", "nvlink", "xid"):
            assert (checks[name]["status"], checks[name]["reason"]) == ("UNKNOWN", RELEASED)
        assert h.verdict() == "TESTING"
        writes = len(h.node_writes())
        await gap_runs(h)
        assert len(h.node_writes()) == writes  # a steady gap writes nothing


async def test_a_held_finding_is_not_released_by_runs_in_the_gap(
        api: ApiEmulator, tmp_path: Path) -> None:
    async with running_agent(api, tmp_path, spec="remap-pending") as h:
        await eventually(lambda: h.verdict() == "ERR", 10, "ERR")
        h.annotate(**{KEYS.repair: record("resetting", JOB)})
        await eventually(lambda: released(h) == JOB, 10, "the release published")
        h.sim.nvml.clear_faults()  # had NVML been read, every run would now be clean
        await gap_runs(h)
        assert ("REMAP_PENDING", "gpu3") in held(h) and h.verdict() == "ERR"


async def test_leaving_resetting_takes_nvml_up_again_and_finds_what_the_gap_hid(
        api: ApiEmulator, tmp_path: Path) -> None:
    async with running_agent(api, tmp_path) as h:
        await h.judged()
        h.annotate(**{KEYS.repair: record("resetting", JOB)})
        await eventually(lambda: released(h) == JOB, 10, "the release published")
        assert h.sim.kernel_log is not None
        h.sim.kernel_log.append(XID79_GPU5)  # the driver logs it; no event set listens
        h.sim.nvml.inject(GpuFault(gpu=2, remapped_rows=RemappedRowsFault(pending=True)))
        await gap_runs(h, "xid")
        assert h.verdict() == "TESTING" and not held(h)

        h.annotate(**{KEYS.repair: record("validating")})
        await eventually(lambda: released(h) is None, 10, "the release withdrawn")
        assert h.sim.nvml.sessions().event_sets == 1  # listening for XIDs again
        h.sim.nvml.emit_xid(6, 48)
        await eventually(lambda: {("XID_79", "gpu5"), ("REMAP_PENDING", "gpu2"),
                                  ("XID_48", "gpu6")} <= held(h), 10, "the gap's faults")
        assert h.verdict() == "EVICT"


async def test_a_release_left_by_a_killed_agent_goes_once_the_record_moved_on(
        api: ApiEmulator, tmp_path: Path) -> None:
    node = node_object()
    node["metadata"]["annotations"] = {KEYS.repair: record("validating"),
                                       KEYS.nvml_released: JOB}
    api.seed(node)
    async with running_agent(api, tmp_path, seed=False) as h:
        await eventually(lambda: released(h) is None, 10, "the stale release withdrawn")
        assert h.sim.nvml.sessions().holding


@pytest.mark.parametrize("text", [
    record("validating"), record("reboot-requested", JOB), record(""), record("held"),
    record("waiting"), "not JSON", '{"state": 7, "job": "' + JOB + '"}', "[]",
], ids=["validating", "reboot-requested", "idle", "held", "waiting", "garbage",
        "state not a string", "not an object"])
async def test_a_record_in_any_other_state_releases_nothing(
        api: ApiEmulator, tmp_path: Path, text: str) -> None:
    async with running_agent(api, tmp_path) as h:
        await h.judged()
        before = h.sim.nvml.sessions()
        h.annotate(**{KEYS.repair: text})
        h.request("remapped", run_id="after-the-record")  # answered: the record was seen
        await eventually(lambda: (h.last_run() or {}).get("id") == "after-the-record", 10,
                         "the answer")
        assert released(h) is None
        assert h.sim.nvml.sessions() == before  # never let go, never opened again


async def test_an_agent_started_during_a_reset_never_opens_nvml_and_says_it_let_go(
        api: ApiEmulator, tmp_path: Path) -> None:
    """A new agent process (a rollout, an OOM kill) on a node whose record says
    `resetting`, whose Node it cannot read at first: its rounds run, NVML stays shut;
    once it reads the Node it publishes the release (its predecessor's annotation is
    gone) without ever having opened NVML; when the record moves on, it opens NVML;
    killed, it holds nothing. What it holds is read from the machine's directory,
    outside the process."""
    node = node_object()
    node["metadata"]["annotations"] = {KEYS.repair: record("resetting", JOB)}
    api.seed(node)
    api.fail("GET", r"/api/v1/nodes(/.*)?", 503, times=10**6)  # its Node cannot be read
    config = tmp_path / "healthd.yaml"
    config.write_text("checks:\n  remapped: {interval: 1s}\n  pciebw: {enabled: false}\n"
                      "agent: {jitter: 0, api_timeout_s: 1}\n")
    control, port = tmp_path / "control.jsonl", free_port()
    argv = [*HEALTHD, "agent", "--sim", "healthy-8xh100", "--sim-control", str(control),
            "--kubeconfig", str(api.write_kubeconfig(tmp_path / "kubeconfig")),
            "--node", NODE, "--http-port", str(port), "--config", str(config)]
    async with await anyio.open_process(argv, env=clean_env(tmp_path)) as proc:
        try:
            def nvml() -> Sessions:
                return nvml_sessions(control).get(proc.pid, Sessions())

            def annotations() -> dict[str, str]:
                return dict(api.get("Node", NODE)["metadata"].get("annotations") or {})

            await eventually(lambda: (scraped(port, "healthd_check_runs_total",
                                              check="remapped") or 0) >= 2, 30,
                             "rounds while the Node cannot be read")
            assert nvml() == Sessions()  # not one nvmlInit
            api.clear_faults()
            await eventually(lambda: annotations().get(KEYS.nvml_released) == JOB, 30,
                             "the release published")
            assert nvml() == Sessions()

            api.put(edited(api.get("Node", NODE), **{KEYS.repair: record("validating")}))
            await eventually(lambda: KEYS.nvml_released not in annotations()
                             and nvml().holding, 30, "NVML opened again")
        finally:
            proc.kill()
        await proc.wait()
        assert not nvml().holding and nvml().inits >= 1  # gone with the process


def edited(node: dict[str, Any], **annotations: str) -> dict[str, Any]:
    """`node` with `annotations` set, as an admin's write leaves it."""
    node["metadata"]["annotations"] = {**node["metadata"].get("annotations", {}), **annotations}
    return node
