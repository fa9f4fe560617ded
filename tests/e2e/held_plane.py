"""Not collected (no `test_` file name): the test run that test_killed_run.py starts
and then ends from outside. It brings the session's real control plane up through
the `realcluster` fixture, as every e2e run does, writes where each of its programs
runs to the file `HEALTHD_HELD_PLANE` names, and waits to be ended."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from tests.realcluster.cluster import ControlPlane

HOLD_S = 120.0  # past this nobody ended it: it ends by itself, its plane with it


def test_hold_the_control_plane_until_ended(realcluster: ControlPlane) -> None:
    report = Path(os.environ["HEALTHD_HELD_PLANE"])
    partial = report.with_suffix(".partial")
    partial.write_text(json.dumps(realcluster.pids()))
    partial.replace(report)  # whole or not there: the outer test polls for it
    time.sleep(HOLD_S)
