"""End-to-end agent tests: the API emulator for every test of the folder; simulated
GPUs for the runner's."""

from healthd.sim.apiserver.testing import api, sync_api  # noqa: F401
from tests.sim.conftest import clock, machine  # noqa: F401  (pytest fixtures)
