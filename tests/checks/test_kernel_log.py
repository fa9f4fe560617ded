"""The kernel log as a source (checks.kernel_log): records and NVIDIA lines parsed,
PCI addresses matched whatever printed them, the position kept across restarts (and
forgotten on a new boot), XIDs NVML already delivered counted once, and garbage
skipped, counted by reason and logged once per reason."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest

from checks.kernel_log import (
    MAX_RECORD,
    SKIP_REASONS,
    KernelLog,
    LoggedSxid,
    LoggedXid,
    LogUnavailable,
    SkippedLines,
    parse_nvidia,
    parse_record,
    pci_key,
)
from checks.snapshot import XidEvent
from healthd.sim.kernellog import SimKernelLog

from .gpufakes import healthy_gpu

XID79 = ("NVRM: Xid (PCI:0000:58:00): 79, pid='<unknown>', name=<unknown>, "
         "GPU has fallen off the bus.")
SXID = "nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12020, Fatal, Link 32 egress sequence ID error"


def test_records_and_nvidia_lines_are_parsed() -> None:
    record = parse_record(f"4,1234,5000000,-;{XID79}\n")
    assert record is not None and (record.seq, record.usec) == (1234, 5_000_000)
    assert parse_nvidia(record) == LoggedXid(79, "0000:58:00", 1234, 5_000_000, XID79)
    sxid = parse_nvidia(parse_record(f"4,7,9,-,caller=T1;{SXID}"))  # type: ignore[arg-type]
    assert isinstance(sxid, LoggedSxid)
    assert (sxid.sxid, sxid.switch, sxid.pci, sxid.fatal, sxid.link) == (
        12020, "nvswitch3", "0000:05:00", True, 32)
    for junk in (" SUBSYSTEM=pci", "no header", "4,x,1,-;text", ""):
        assert parse_record(junk) is None
    assert parse_nvidia(parse_record("6,1,1,-;eth0: link up")) is None  # type: ignore[arg-type]


def test_pci_addresses_match_whatever_printed_them() -> None:
    assert pci_key("0000:58:00") == pci_key("00000000:58:00.0") == pci_key("58:00.0")
    assert pci_key("0000:58:00") != pci_key("0000:59:00")


def log_in(tmp_path: Path) -> tuple[SimKernelLog, Path]:
    return SimKernelLog(tmp_path / "kmsg", lambda: 100.0), tmp_path / "state" / "pos.json"


def test_a_restart_neither_loses_nor_repeats_a_line(tmp_path: Path) -> None:
    sim, state = log_in(tmp_path)
    sim.write_history(["boot noise", XID79])
    first = KernelLog(sim.path, state_file=state)
    assert [x.xid for x in first.take("xid")] == [79]
    assert first.take("xid") == []  # handed out once
    first.close()
    sim.append(XID79.replace("79,", "48,"))  # logged while the agent was down
    second = KernelLog(sim.path, state_file=state)
    assert [x.xid for x in second.take("xid")] == [48]
    assert second.take("sxid") == []  # each consumer has its own position


def test_a_new_boot_reads_from_the_start_and_a_damaged_state_too(tmp_path: Path) -> None:
    sim, state = log_in(tmp_path)
    sim.write_history([XID79])
    KernelLog(sim.path, state_file=state).take("xid")
    saved = json.loads(state.read_text())
    state.write_text(json.dumps({**saved, "boot_id": "another-boot"}))
    assert [x.xid for x in KernelLog(sim.path, state_file=state).take("xid")] == [79]
    state.write_text("{not json")
    assert [x.xid for x in KernelLog(sim.path, state_file=state).take("xid")] == [79]


def test_an_xid_nvml_delivered_is_counted_once(tmp_path: Path) -> None:
    sim, _ = log_in(tmp_path)
    sim.write_history([XID79])
    log = KernelLog(sim.path, uptime=lambda: 100.0, dedup_window_s=10)
    gpu = healthy_gpu(4)  # bus 0x58
    live = XidEvent(79, 4, gpu.uuid, at=time.time())
    logged = [x for x in log.take("xid") if isinstance(x, LoggedXid)]
    assert log.merge_xids([live], logged, [gpu]) == [live]


def test_an_xid_only_the_log_saw_is_on_its_gpu(tmp_path: Path) -> None:
    sim, _ = log_in(tmp_path)
    sim.write_history([XID79])
    log = KernelLog(sim.path, uptime=lambda: 100.0)
    gpu = healthy_gpu(4)
    logged = [x for x in log.take("xid") if isinstance(x, LoggedXid)]
    (event,) = log.merge_xids([], logged, [gpu])
    assert (event.xid, event.gpu_index, event.uuid) == (79, 4, gpu.uuid)


def test_an_unreadable_log_is_unavailable_not_a_crash(tmp_path: Path) -> None:
    (tmp_path / "missing").mkdir()  # opens, but cannot be read
    with pytest.raises(LogUnavailable, match="cannot read"):
        KernelLog(tmp_path / "missing").take("xid")


@pytest.mark.root
@pytest.mark.anyio
async def test_the_real_device_is_read_to_its_end_and_wakes_a_waiter() -> None:
    kmsg = Path("/dev/kmsg")
    if not kmsg.is_char_device():
        pytest.skip("no /dev/kmsg here")
    import anyio

    log = KernelLog(kmsg)
    try:
        log.take("xid")  # whatever this host logged: read to its end (EAGAIN), no error
        woke = anyio.Event()

        async def waiter() -> None:
            await log.wait(poll_s=60)
            woke.set()

        async with anyio.create_task_group() as group:
            group.start_soon(waiter)
            await anyio.sleep(0.05)
            with kmsg.open("w") as device:  # one harmless line in the host's log
                device.write("<6>healthd test: kernel-log reader wake-up\n")
            with anyio.fail_after(5):
                await woke.wait()
    finally:
        log.close()


def test_a_position_that_cannot_be_kept_loses_nothing(tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    sim, _ = log_in(tmp_path)
    sim.write_history([XID79])
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    log = KernelLog(sim.path, state_file=blocker / "pos.json")
    assert [x.xid for x in log.take("xid")] == [79]
    assert "cannot keep the kernel-log position" in caplog.text


# One line of each kind of garbage the reader tells apart, as raw bytes in the file
# (SEQ: the record's sequence number).
GARBAGE = {
    "not_utf8": b"4,SEQ,1000,-;\xff\xfe\xfd from nowhere",
    "oversize": b"4,SEQ,1000,-;" + b"x" * MAX_RECORD,
    "not_a_record": b"this line has no record header",
    "bad_xid": b"4,SEQ,1000,-;NVRM: Xid (PCI:0000:58:00): seventy-nine, GPU has fallen",
    "bad_sxid": b"4,SEQ,1000,-;nvidia-nvswitch3: SXid (PCI:0000:05:00.0): Fatal",
}


def garbage_log(tmp_path: Path, rounds: int) -> Path:
    """A log with `rounds` lines of each kind of garbage, then an XID 79 after them."""
    lines = [b"6,1,900,-;Linux version 6.8.0 (boot)"]
    for n, raw in enumerate(list(GARBAGE.values()) * rounds):
        lines.append(raw.replace(b"SEQ", str(10 + n).encode()))
    lines.append(f"4,1000,2000,-;{XID79}".encode())
    path = tmp_path / "kmsg"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def test_garbage_is_skipped_counted_by_reason_and_logged_once_per_reason(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    skipped = SkippedLines()
    log = KernelLog(garbage_log(tmp_path, rounds=3), skipped=skipped)
    with caplog.at_level(logging.WARNING, logger="checks.kernel_log"):
        assert [(x.xid, x.seq) for x in log.take("xid")] == [(79, 1000)]  # read past it all
        assert log.take("sxid") == []  # the bad SXID line is no SXID
    assert skipped.counts() == dict.fromkeys(SKIP_REASONS, 3)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == len(SKIP_REASONS), warnings
    assert any("seventy-nine" in w for w in warnings)  # the line itself, to look into


def test_a_record_with_bytes_that_are_not_utf8_is_judged_by_its_header_and_code(
        tmp_path: Path) -> None:
    """A process name kept as its bytes (a journal export, a syslog file) costs the
    record nothing; bytes that cut a field healthd judges by, or a line in which
    nothing can be read, are counted."""
    sim, _ = log_in(tmp_path)
    name = b"\xff\xfe-trainer"  # a user's process name, not UTF-8
    sim.append(b"NVRM: Xid (PCI:0000:38:00): 13, pid=1, name=" + name + b" tail")
    sim.append(XID79.encode().replace(b"name=<unknown>", b"name=" + name))
    sim.append(SXID.encode().replace(b"egress", name))
    for cut in (b"NVRM: Xid (PCI:0000:38:00): 1\xff3, pid=1, name=x",
                b"NVRM: Xid (PCI:0000:38:00): 13\xff, pid=1, name=x",
                b"NVRM: Xid (PCI:0000:3\xff:00): 13, pid=1, name=x",
                b"nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12020, Fat\xffal, Link 32",
                b"NVRM: X\xffd (PCI:0000:38:00): 79, pid=1, name=x"):
        sim.append(cut)
    skipped = SkippedLines()
    log = KernelLog(sim.path, skipped=skipped)
    assert [(x.xid, x.pci) for x in log.take("xid")] == [(13, "0000:38:00"), (79, "0000:58:00")]
    (sxid,) = log.take("sxid")
    assert isinstance(sxid, LoggedSxid) and (sxid.sxid, sxid.fatal) == (12020, True)
    assert skipped.counts() == {**dict.fromkeys(SKIP_REASONS, 0),
                                "bad_xid": 3, "bad_sxid": 1, "not_utf8": 1}


def test_an_oversize_line_written_in_pieces_is_skipped_once(tmp_path: Path) -> None:
    """A line still unfinished past a record's size is skipped as one oversize line
    once it ends (the reader keeps no more of it than that), and the reader goes on."""
    path = tmp_path / "kmsg"
    path.write_bytes(b"4,1,1,-;" + b"x" * MAX_RECORD)
    skipped = SkippedLines()
    log = KernelLog(path, skipped=skipped)
    with path.open("ab") as more:
        for _ in range(3):
            assert log.take("xid") == []
            more.write(b"y" * MAX_RECORD)
            more.flush()
        more.write(f"\n4,2,2,-;{XID79}\n".encode())
    assert [x.xid for x in log.take("xid")] == [79]
    assert skipped.counts()["oversize"] == 1
