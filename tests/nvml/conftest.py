"""The NVML reader tests run over the fake NVML library: the same steppable clock
and machine fixtures as the simulator's own tests."""

from tests.sim.conftest import clock, machine  # noqa: F401  (pytest fixtures)
