"""The API emulator, for the tests that run the agent (test_agent.py)."""

from healthd.sim.apiserver.testing import api  # noqa: F401  (pytest fixture)
