"""Fleet tool tests: the API emulator for every test of the folder."""

from healthd.sim.apiserver.testing import api, sync_api  # noqa: F401
