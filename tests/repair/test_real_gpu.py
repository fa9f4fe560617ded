"""What holds a real GPU, asked of the real NVML and /proc (skipped without a GPU):
`healthd gpu-reset --holders-only` finds every GPU with its minor number and
persistence mode, and names a process that keeps an NVML session open by its pid,
through its open device files. Nothing is reset and nothing is changed: no test ever
resets a real GPU."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pynvml
import pytest

pytestmark = pytest.mark.gpu

_HOLD = """
import pynvml
pynvml.nvmlInit()
print("holding", flush=True)
input()
"""


def real_uuids() -> list[str]:
    pynvml.nvmlInit()
    try:
        count = pynvml.nvmlDeviceGetCount()
        return [str(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i)))
                for i in range(count)]
    finally:
        pynvml.nvmlShutdown()


def test_holders_only_names_an_nvml_client_and_changes_nothing() -> None:
    uuids = real_uuids()
    holder = subprocess.Popen([sys.executable, "-c", _HOLD], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "holding\n"
        done = subprocess.run([sys.executable, "-m", "healthd.cli", "gpu-reset",
                               "--holders-only", "--", *uuids],
                              capture_output=True, text=True, timeout=120, check=False)
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)
    assert done.returncode == 0, done.stdout + done.stderr
    found = json.loads(done.stdout)
    print(json.dumps(found, indent=1))  # what holds the GPUs of this machine, for the log
    assert found["ok"] is True
    assert [g["uuid"] for g in found["gpus"]] == uuids
    for gpu in found["gpus"]:
        assert isinstance(gpu["minor"], int) and isinstance(gpu["persistence_mode"], bool)
        assert any(h.startswith(f"pid {holder.pid} (python") and f"/dev/nvidia{gpu['minor']} "
                   "open" in h for h in gpu["holders"]), gpu["holders"]
    # Persistence mode as nvidia-smi itself reports it, GPU by GPU.
    smi = shutil.which("nvidia-smi")
    if smi is not None:
        listed = subprocess.run([smi, "--query-gpu=uuid,persistence_mode",
                                 "--format=csv,noheader"], capture_output=True, text=True,
                                timeout=60, check=True).stdout
        modes = {u.strip(): m.strip() == "Enabled" for u, m in
                 (line.split(",") for line in listed.splitlines() if line.strip())}
        assert {g["uuid"]: g["persistence_mode"] for g in found["gpus"]} == modes
