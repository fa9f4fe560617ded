"""What holds a GPU on a real node, read from the real /proc: a process with the GPU's
device file open is found by its pid and name, through its fd links, as fuser finds
it; the command's own process is left out; NVML's processes and persistence mode are
named beside them. Device files are stood in for by plain files of the same names in
a temporary folder (the device folder is injectable), so no GPU is needed."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from checks.nvml_reset import GpuView
from healthd.repair.holders import ProcDeviceUsers, device_paths, holders

_OPEN = """
import sys
files = [open(path) for path in sys.argv[1:]]
print("open", flush=True)
sys.stdin.readline()
"""


@contextmanager
def opening(*paths: Path) -> Iterator[subprocess.Popen[str]]:
    """A child process that has `paths` open while the block runs."""
    proc = subprocess.Popen([sys.executable, "-c", _OPEN, *map(str, paths)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "open\n"
        yield proc
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=30)


def devices(tmp_path: Path) -> Path:
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidia2", "nvidia3", "nvidiactl"):
        (dev / name).touch()
    return dev


def test_a_process_with_the_gpus_device_file_open_is_found_by_pid_and_name(
        tmp_path: Path) -> None:
    dev = devices(tmp_path)
    with opening(dev / "nvidia3", dev / "nvidiactl") as child, opening(dev / "nvidia2") as other:
        found = ProcDeviceUsers().users(device_paths(3, dev))
        named = holders(GpuView("GPU-x", minor=3), ProcDeviceUsers(), own_pid=-1, dev=dev)
        other_pid = other.pid
    assert {(u.pid, u.path) for u in found} == {(child.pid, str(dev / "nvidia3")),
                                                (child.pid, str(dev / "nvidiactl"))}
    assert all(u.name.startswith("python") for u in found)
    assert named == [f"pid {child.pid} ({found[0].name}): {dev}/nvidia3 open, "
                     f"{dev}/nvidiactl open"]
    assert str(other_pid) not in " ".join(named)  # another GPU's user


def test_own_process_is_left_out_and_nvml_and_persistence_mode_are_named(
        tmp_path: Path) -> None:
    dev = devices(tmp_path)
    with opening(dev / "nvidia2") as child:
        view = GpuView("GPU-x", minor=2, persistence=True,
                       processes=((child.pid, "compute"), (999_999_999, "graphics")))
        named = holders(view, ProcDeviceUsers(), own_pid=child.pid, dev=dev)
        not_left_out = holders(view, ProcDeviceUsers(), own_pid=-1, dev=dev)
    assert named == ["pid 999999999: graphics process", "persistence mode"]
    assert not_left_out[0].startswith(f"pid {child.pid} (python")
    assert not_left_out[0].endswith(f": compute process, {dev}/nvidia2 open")


def test_nothing_is_found_where_nothing_has_it_open(tmp_path: Path) -> None:
    dev = devices(tmp_path)
    assert ProcDeviceUsers().users(device_paths(3, dev)) == []
    assert ProcDeviceUsers(tmp_path / "no-proc").users(device_paths(3, dev)) == []
    assert holders(GpuView("GPU-x"), ProcDeviceUsers(), own_pid=-1, dev=dev) == []
