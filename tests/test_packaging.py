"""Building healthd's package is quiet: no deprecation warning from setuptools on
every install (the license is an SPDX expression, as PEP 639 asks)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_building_the_package_warns_about_nothing_deprecated(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "-w", str(tmp_path),
         str(ROOT)], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0 and "No matching distribution" in proc.stdout + proc.stderr:
        pytest.skip("no package index to fetch the build backend from")
    assert proc.returncode == 0, proc.stderr[-2000:]
    warnings = [line for line in (proc.stdout + proc.stderr).splitlines()
                if "deprecated" in line.lower()]
    assert warnings == []
    assert list(tmp_path.glob("healthd-*.whl"))
