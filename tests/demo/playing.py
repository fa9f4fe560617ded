"""Playing scenarios the way a user does: `healthd demo --scenario NAME --output json`,
its exit code and parsed output. A bundled scenario is played once per test session,
whichever tests read it."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path
from typing import Any

import yaml

from healthd.demo.command import run
from healthd.demo.scenario import resolve

_PLAYED: dict[str, tuple[int, dict[str, Any]]] = {}


def play_json(scenario: str) -> tuple[int, dict[str, Any]]:
    """`healthd demo --scenario SCENARIO --output json`: exit code and parsed output."""
    stream = io.StringIO()
    args = argparse.Namespace(scenario=scenario, nodes=None, output="json", serve=None)
    code = run(args, stream)
    return code, json.loads(stream.getvalue())


def played(name: str) -> tuple[int, dict[str, Any]]:
    """A bundled scenario's run (each one played once per test session)."""
    if name not in _PLAYED:
        _PLAYED[name] = play_json(name)
    return _PLAYED[name]


def bundled_raw(name: str) -> dict[str, Any]:
    """A bundled scenario's YAML as data, to play a variant of it."""
    raw = yaml.safe_load(resolve(name).read_text())
    assert isinstance(raw, dict)
    return raw


def play_variant(raw: dict[str, Any], folder: Path) -> tuple[int, dict[str, Any]]:
    """Play the scenario `raw` from a file in `folder`, as a user's own file is."""
    path = folder / f"{raw['name']}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return play_json(str(path))
