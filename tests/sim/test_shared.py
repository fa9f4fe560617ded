"""One simulated machine across processes: every process started with the same control
file runs on one machine, whose clock and files go on when a process is replaced. An
XID that fired while one process listened never reaches the next, the kernel log's
lines are read once across restarts, and another spec on the same file is another
machine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pynvml
import pytest
import yaml

from checks.kernel_log import KernelLog
from checks.probes import LoggedXid
from healthd.config import Config
from healthd.sim.apiserver import ApiEmulator
from healthd.sim.machine import MachineSpec, load_machine_spec
from healthd.sim.node import SimulatedNode, simulate
from tests.agent.harness import NODE, eventually, node_object, scraped
from tests.agent.test_process import HEALTHD, clean_env
from tests.realcluster.processes import free_port

N = pynvml
XID79_GPU5 = ("NVRM: Xid (PCI:0000:68:00): 79, pid='<unknown>', name=<unknown>, "
              "GPU has fallen off the bus.")


def machine(**fields: Any) -> MachineSpec:
    """8 healthy H100s, with `fields` of the spec changed."""
    return MachineSpec.model_validate({**load_machine_spec("healthy-8xh100").model_dump(),
                                       **fields})


def with_xid(code: int, at: float, **fields: Any) -> MachineSpec:
    """XID `code` on GPU 3 at `at` s."""
    return machine(faults=[{"gpu": 3, "xid": [{"code": code, "at": at}]}], **fields)


def listen(gpu: int) -> object:
    """A new NVML session's event set, registered for XIDs on `gpu` now."""
    N.nvmlInit()
    event_set = N.nvmlEventSetCreate()
    N.nvmlDeviceRegisterEvents(N.nvmlDeviceGetHandleByIndex(gpu),
                               N.nvmlEventTypeXidCriticalError, event_set)
    return event_set


def heard(event_set: object, timeout_ms: int) -> int | None:
    try:
        return int(N.nvmlEventSetWait(event_set, timeout_ms).eventData)
    except N.NVMLError_Timeout:
        return None


def test_an_xid_that_fired_during_one_process_never_reaches_the_next(tmp_path: Path) -> None:
    # Late enough that the first process has registered for XIDs, even on a loaded
    # machine (an XID before the registration reaches nobody, by design).
    spec, control = with_xid(79, at=1.5), tmp_path / "control.jsonl"
    with simulate(spec, control) as first:
        events = listen(3)
        assert heard(events, 5000) == 79
        assert heard(events, 0) is None  # once
        left_at, uptime = first.nvml.now(), first.uptime()
    with simulate(spec, control) as second:
        assert second.nvml.now() >= left_at  # the machine's clock went on
        assert second.uptime() >= uptime
        events = listen(3)
        assert heard(events, 1800) is None  # a process-relative clock would fire it at 1.5 s


def agent_log(sim: SimulatedNode) -> KernelLog:
    """The kernel log as an agent on `sim` opens it (its path and position file)."""
    settings = sim.adapt(Config()).agent.kernel_log
    return KernelLog(Path(settings.path), state_file=Path(settings.state_file),
                     uptime=sim.uptime)


def taken(log: KernelLog) -> list[int]:
    try:
        return [line.xid for line in log.take("xid") if isinstance(line, LoggedXid)]
    finally:
        log.close()


def test_a_restarted_agent_reads_the_kernel_log_on_from_where_the_last_stopped(
        tmp_path: Path) -> None:
    spec = machine(kernel_log=[XID79_GPU5])  # the history: one XID line
    control = tmp_path / "control.jsonl"
    with simulate(spec, control) as first:
        assert taken(agent_log(first)) == [79]
    with simulate(spec, control) as second:
        assert taken(agent_log(second)) == []  # neither rewritten nor read again
        assert second.kernel_log is not None
        second.kernel_log.append(XID79_GPU5.replace(": 79,", ": 48,"))  # while it runs
    with simulate(spec, control) as third:
        assert taken(agent_log(third)) == [48]


def test_another_spec_on_the_same_control_file_is_another_machine(tmp_path: Path) -> None:
    control = tmp_path / "control.jsonl"
    with simulate(with_xid(79, at=0.3), control):
        assert heard(listen(3), 5000) == 79
    reimaged = with_xid(79, at=0.3, uptime_s=60)
    with simulate(reimaged, control) as second:
        assert second.nvml.now() < 0.3  # started afresh: its XID is still to come
        assert heard(listen(3), 5000) == 79
    with simulate(reimaged, control):  # and the next process goes on with it
        assert heard(listen(3), 600) is None


def xids_counted(port: int, code: int) -> float | None:
    """What an agent's /metrics counts of XID `code` (0 when it never saw one; None
    while the agent does not answer yet)."""
    return scraped(port, "healthd_gpu_xid_events_total", xid=str(code))


XID_AT_S = 2.0  # after the first agent registered for XIDs, well before it is stopped


@pytest.mark.anyio
async def test_a_second_agent_on_the_machine_never_sees_the_xid_the_first_one_saw(
        api: ApiEmulator, tmp_path: Path) -> None:
    api.seed(node_object())
    spec, control = tmp_path / "spec.yaml", tmp_path / "control.jsonl"
    spec.write_text(yaml.safe_dump(with_xid(79, at=XID_AT_S).model_dump(mode="json")))
    config = tmp_path / "healthd.yaml"
    config.write_text("checks:\n  xid: {interval: 1s}\nagent: {jitter: 0}\n")

    async def agent_until(done: Any, what: str) -> None:
        port = free_port()
        argv = [*HEALTHD, "agent", "--sim", str(spec), "--sim-control", str(control),
                "--kubeconfig", str(api.write_kubeconfig(tmp_path / "kubeconfig")),
                "--node", NODE, "--http-port", str(port), "--config", str(config)]
        async with await anyio.open_process(argv, env=clean_env(tmp_path)) as proc:
            try:
                await done(port, what)
            finally:
                proc.kill()

    async def counts_xid_79(port: int, what: str) -> None:
        await eventually(lambda: xids_counted(port, 79) == 1, 30, what)

    async def never_counts_it(port: int, what: str) -> None:
        await eventually(lambda: xids_counted(port, 79) is not None, 30, "the second agent up")
        await anyio.sleep(XID_AT_S + 1)  # its own 2 s go by: a replay would fire now
        with open(control, "a") as changes:  # an XID it does hear, to know it listens
            changes.write(json.dumps({"op": "emit_xid", "gpu": 2, "code": 31}) + "\n")
        await eventually(lambda: xids_counted(port, 31) == 1, 30, what)
        assert xids_counted(port, 79) == 0

    await agent_until(counts_xid_79, "the first agent hears XID 79")
    await agent_until(never_counts_it, "the second agent hears the XID 31 emitted for it")


def test_a_corrupt_start_time_is_refused_naming_the_file(tmp_path: Path) -> None:
    control = tmp_path / "control.jsonl"
    with simulate("healthy-8xh100", control):
        pass
    started = tmp_path / "control.jsonl.machine" / "started"
    started.write_text("yesterday\n")
    with pytest.raises(ValueError, match=str(started)), simulate("healthy-8xh100", control):
        pass
