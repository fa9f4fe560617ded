"""The rules that keep the code base readable, checked on every run: the import
contracts in pyproject.toml (`[tool.importlinter]`: healthd's layers, `checks/`
apart from `healthd`, the simulation, the Kubernetes client and NVML each behind
their door), `mypy --strict` finds nothing in `checks/` and `healthd/`, and the tree
is lint-clean."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def tool(name: str) -> str:
    """A console script of the test extras, next to this interpreter."""
    path = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (it comes with the test extras)")
    return path


def test_import_contracts_are_kept() -> None:
    # The graph cache lives in the virtualenv, beside mypy's: warm runs take a second.
    cache = Path(sys.prefix) / ".import_linter_cache"
    proc = subprocess.run([tool("lint-imports"), "--cache-dir", str(cache)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_strict_finds_nothing() -> None:
    # Settings (strict, the pydantic plugin, the cache under .venv) in pyproject.toml.
    proc = subprocess.run([tool("mypy")], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ruff_clean() -> None:
    proc = subprocess.run(
        [tool("ruff"), "check", "--no-cache", str(ROOT)], capture_output=True, text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout
