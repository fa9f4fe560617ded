"""The rules that keep the code base readable, checked on every run: `checks/` never
imports `healthd` (or Prometheus), only the NVML access layer and the simulator touch
pynvml, and the tree is lint-clean."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def python_files(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def test_checks_never_import_healthd_or_prometheus() -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(
            m for m in imported_modules(path) if m.split(".")[0] in ("healthd", "prometheus_client")
        )
        for path in python_files("checks")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_only_the_access_layer_and_the_simulator_import_pynvml() -> None:
    allowed = {"checks/nvml_reader.py"}
    users = {
        str(path.relative_to(ROOT))
        for folder in ("checks", "healthd")
        for path in python_files(folder)
        if "pynvml" in imported_modules(path)
    }
    assert {u for u in users if u not in allowed and not u.startswith("healthd/sim/")} == set()


def test_ruff_clean() -> None:
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    if not Path(ruff).exists():
        pytest.skip("ruff is not installed (it comes with the test extras)")
    proc = subprocess.run(
        [ruff, "check", "--no-cache", str(ROOT)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout
