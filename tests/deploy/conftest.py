"""Deploy tests: the API emulator fixture for the RBAC scenarios."""

from healthd.sim.apiserver.testing import api  # noqa: F401
