"""Simulated DCGM: a fake `dcgmi` that replays recorded diagnostic outputs.

`DcgmSim` is the `dcgm:` part of a simulated machine spec; `fake_dcgmi_command(sim)`
is the command line the dcgm check runs instead of `dcgmi` (it appends `diag -r N -j`
itself). Recordings live in `outputs/`, listed with their exit status in
`outputs/index.json`:

| name | exit | what |
| --- | --- | --- |
| `v4-pass-r1` | 0 | DCGM 4.x level 1, 8 GPUs pass |
| `v4-pass-r3` | 0 | DCGM 4.x level 3, 8 GPUs pass (one Warn, some Skip) |
| `v4-fail-r3` | 226 | 4.x: memory fails on GPU 2 (row remap failure), targeted_stress on GPU 5 |
| `v4-fail-pcie` | 226 | 4.x level 2: pcie fails on GPU 1 (replays) |
| `v4-isolate-pcie` | 205 | 4.x level 2: pcie on GPU 3 at ISOLATE severity |
| `v4-runtime-error` | 226 | 4.x: the diagnostic could not run (runtime_error) |
| `v3-pass` | 0 | DCGM 3.x level 3, 8 GPUs pass |
| `v3-fail-pcie` | 226 | 3.x level 2: PCIe fails on GPU 1 |
| `garbage` | 0 | not JSON at all |
"""

from __future__ import annotations

import sys
from pathlib import Path

from pydantic import Field, field_validator

from healthd.util.models import Frozen

FAKE_DCGMI = Path(__file__).resolve().parent / "fake_dcgmi.py"

__all__ = ["FAKE_DCGMI", "DcgmSim", "fake_dcgmi_command", "recorded_names"]


def recorded_names() -> dict[str, dict[str, object]]:
    """name -> {"file", "exit", "about"} for every recorded output."""
    # Imported late: `python -m healthd.sim.dcgm.fake_dcgmi` must find it unimported.
    from healthd.sim.dcgm import fake_dcgmi

    return fake_dcgmi.recorded_names()


class DcgmSim(Frozen):
    """How the simulated machine's `dcgmi diag` behaves."""

    output: str = Field(default="v4-pass-r1", description="a recorded output name, or a file path")
    exit: int | None = Field(
        default=None, ge=0, le=255, description="exit status; unset: the recording's own"
    )
    sleep_s: float = Field(default=0.0, ge=0, description="seconds the diagnostic takes")
    version: str = Field(default="4.2.3", description="what `dcgmi --version` reports")
    stdout: str | None = Field(
        default=None,
        description="a recorded `dcgmi diag -j` output, inline (healthd record writes it); "
        "replaces `output`",
    )
    host_engine: str | None = Field(
        default=None,
        description="where the host engine listens (`none`: nowhere, so dcgmi cannot "
        "connect); unset: wherever the check asks",
    )

    @field_validator("output")
    @classmethod
    def _known_output(cls, value: str) -> str:
        if value in recorded_names() or Path(value).is_file():
            return value
        names = ", ".join(sorted(recorded_names()))
        raise ValueError(f"{value!r} is neither a recorded output ({names}) nor a file")


def fake_dcgmi_command(sim: DcgmSim) -> list[str]:
    """The command (executable and leading args) that stands in for `dcgmi`."""
    argv = [sys.executable, str(FAKE_DCGMI)]
    if sim.stdout is not None:
        argv += ["--text", sim.stdout]
    else:
        output = sim.output if sim.output in recorded_names() else str(Path(sim.output).resolve())
        argv += ["--output", output]
    if sim.exit is not None:
        argv += ["--exit", str(sim.exit)]
    if sim.sleep_s:
        argv += ["--sleep", repr(sim.sleep_s)]
    if sim.host_engine is not None:
        argv += ["--host-engine", sim.host_engine]
    return [*argv, "--dcgm-version", sim.version]
