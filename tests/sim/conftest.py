"""Fixtures for the simulated GPUs: a steppable clock and a fake NVML machine that is
installed under pynvml (and initialised) for one test, then removed."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pynvml
import pytest

from healthd.sim.apiserver.testing import api  # noqa: F401  (the fixture)
from healthd.sim.fakenvml import FakeNvml, install
from healthd.sim.machine import parse_machine_spec


class StepClock:
    """A machine clock that moves only when the test says so."""

    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock() -> StepClock:
    return StepClock()


Machine = Callable[..., FakeNvml]


@pytest.fixture
def machine(clock: StepClock) -> Iterator[Machine]:
    """Install a machine from spec fields (`gpus`, `faults`, ...) and nvmlInit it."""
    installed: list[FakeNvml] = []

    def make(*, init: bool = True, **fields: Any) -> FakeNvml:
        fake = install(parse_machine_spec(fields), clock=clock)
        installed.append(fake)
        if init:
            pynvml.nvmlInit()
        return fake

    yield make
    for fake in reversed(installed):
        fake.uninstall()
