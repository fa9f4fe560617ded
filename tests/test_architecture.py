"""The rules that keep the code base readable, checked on every run: the import
contracts in pyproject.toml (`[tool.importlinter]`: healthd's layers, `checks/`
apart from `healthd`, the simulation and the Kubernetes client each behind their
door), only the NVML access layer and the simulator touch pynvml, `mypy --strict`
finds nothing in `checks/` and `healthd/`, and the tree is lint-clean."""

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
    proc = subprocess.run(
        [tool("ruff"), "check", "--no-cache", str(ROOT)], capture_output=True, text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout
