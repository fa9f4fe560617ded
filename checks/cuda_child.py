"""The pciebw measurement as a short-lived child process, and the one line it answers.

The agent never loads CUDA itself: a CUDA context and a pinned buffer stay with the
process that made them until it ends, and a copy hung on a failing GPU cannot be
interrupted from Python. So each GPU is measured by a child of its own
(checks.pciebw_probe starts it through checks.processes, in its own process group,
killed with it at the deadline). The child prints ONE JSON line on stdout, exits 0:

    {"h2d_gbps": 55.41, "d2h_gbps": 55.33, "pid": 4242}
    {"error": "cuMemcpyHtoDAsync_v2 failed: CUDA_ERROR_ILLEGAL_ADDRESS", "pid": 4242}
    {"error": "CUDA driver not found", "unavailable": true, "pid": 4242}

`unavailable`: no GPU on this node can be measured (no driver, cuInit failed). `pid` is
the child's own, so the parent can tell the probe from other processes NVML lists.

The child runs on the standard library, checks.cuda and this module, nothing else:
`command()` starts it without running the `checks` package's __init__, which imports
every check (pydantic, anyio: tens of MiB and most of a second the child has no use
for), and in isolated mode without `site` (`-I -S`), so neither the environment's
PYTHON* variables nor the working directory change what it imports.

    python -I -S -c BOOTSTRAP ROOT checks.cuda_child BUS_ID SIZE_BYTES ITERATIONS
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from checks.cuda import CudaDriver, CudaError, CudaUnavailable

GB = 1e9  # PCIe rates are decimal gigabytes per second
ROOT = str(Path(__file__).resolve().parent.parent)  # where the `checks` package lives

# Runs in the child: `checks` becomes a bare package under ROOT (its __init__ is not
# run), then MODULE's `main(args)` is the child's exit status.
BOOTSTRAP = (
    "import importlib, sys, types\n"
    "root, module, *args = sys.argv[1:]\n"
    "sys.path.insert(0, root)\n"
    "package = types.ModuleType('checks')\n"
    "package.__path__ = [root + '/checks']\n"
    "sys.modules['checks'] = package\n"
    "sys.exit(importlib.import_module(module).main(args))\n"
)


def command(module: str, *args: str) -> list[str]:
    """The argv that runs `module.main(args)` as a child (see the module docstring)."""
    return [sys.executable, "-I", "-S", "-c", BOOTSTRAP, ROOT, module, *args]


@dataclass(frozen=True)
class Answer:
    """What a child answered: the rates, or the error that kept it from measuring."""

    h2d_gbps: float = 0.0
    d2h_gbps: float = 0.0
    error: str = ""
    unavailable: bool = False
    pid: int = 0


def encode(answer: Answer) -> str:
    """The answer as the child prints it (one line, no newline)."""
    body: dict[str, object]
    if answer.error:
        body = {"error": answer.error}
        if answer.unavailable:
            body["unavailable"] = True
    else:
        body = {"h2d_gbps": answer.h2d_gbps, "d2h_gbps": answer.d2h_gbps}
    return json.dumps({**body, "pid": answer.pid})


def decode(stdout: str) -> Answer:
    """The answer in a child's stdout: its only line. ValueError, saying what is wrong,
    for anything else."""
    lines = stdout.strip().splitlines()
    if len(lines) != 1:
        raise ValueError(f"expected one line, got {len(lines)}")
    try:
        body = json.loads(lines[0])
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ValueError("not a JSON object")
    pid = body.get("pid", 0)
    if not isinstance(pid, int) or isinstance(pid, bool):
        raise ValueError("pid is not a number")
    error = body.get("error")
    if error is not None:
        if not isinstance(error, str) or not error:
            raise ValueError("error is not a message")
        return Answer(error=error, unavailable=body.get("unavailable") is True, pid=pid)
    rates = [body.get("h2d_gbps"), body.get("d2h_gbps")]
    if not all(isinstance(r, int | float) and not isinstance(r, bool) for r in rates):
        raise ValueError("no h2d_gbps and d2h_gbps numbers")
    return Answer(float(rates[0]), float(rates[1]), pid=pid)  # type: ignore[arg-type]


def measure(pci_bus_id: str, size_bytes: int, iterations: int,
            open_driver: Callable[[], CudaDriver] = CudaDriver) -> Answer:
    """Time pinned copies on the GPU at `pci_bus_id` through the CUDA driver that
    `open_driver` opens (tests open a fake); an error becomes the answer, never an
    exception."""
    pid = os.getpid()
    try:
        h2d_s, d2h_s = open_driver().copy_seconds(pci_bus_id, size_bytes, iterations)
    except CudaUnavailable as exc:
        return Answer(error=str(exc), unavailable=True, pid=pid)
    except CudaError as exc:
        return Answer(error=str(exc), pid=pid)
    moved = size_bytes * iterations / GB
    return Answer(moved / h2d_s, moved / d2h_s, pid=pid)


def main(args: Sequence[str]) -> int:
    """The child: `BUS_ID SIZE_BYTES ITERATIONS` -> one answer line on stdout."""
    try:
        bus_id, size, iterations = args[0], int(args[1]), int(args[2])
    except (IndexError, ValueError):
        print("usage: BUS_ID SIZE_BYTES ITERATIONS", file=sys.stderr)
        return 64
    print(encode(measure(bus_id, size, iterations)), flush=True)
    return 0
