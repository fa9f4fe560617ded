"""Scenario files: every problem is a clear message naming the field, and
`healthd demo` refuses them with exit 78 before starting anything."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from healthd.cli import main
from healthd.demo.scenario import ScenarioError, build_config, check_fits, parse_scenario

GOOD_STEP = {"wait_for": {"node": "gpu-node-1", "verdict": "PASS"}}


def scenario(**fields: Any) -> dict[str, Any]:
    return {"name": "s", "steps": [GOOD_STEP], **fields}


@pytest.mark.parametrize(("raw", "field"), [
    (scenario(steps=[{"wait_for": {"node": "gpu-node-1", "verdict": "BROKEN"}}]),
     "steps.0.wait_for.verdict"),
    (scenario(steps=[GOOD_STEP, {"at": -1, "cordon": "gpu-node-1"}]), "steps.1.at"),
    (scenario(steps=[{"cordon": "gpu-node-1", "uncordon": "gpu-node-1"}]),
     "steps.0: a step needs exactly one of"),
    (scenario(steps=[{"explode": "gpu-node-1"}]), "steps.0.explode"),
    (scenario(steps=[{"fault": {"node": "gpu-node-1", "gpu": 0}}]), "steps.0.fault"),
    (scenario(steps=[{"fault": {"node": "gpu-node-1", "gpu": 0, "remapped_rows": {
        "pending": "maybe"}}}]), "steps.0.fault.remapped_rows.pending"),
    (scenario(steps=[{"wait_for": {"node": "gpu-node-1"}}]), "needs verdict, cordoned"),
    (scenario(steps=[]), "steps:"),
    (scenario(nodes=0), "nodes:"),
    (scenario(machine="no-such-machine"), "machine:"),
    ({"steps": [GOOD_STEP]}, "name:"),
    (scenario(steps=[{**GOOD_STEP, "mark": "a"}, {**GOOD_STEP, "mark": "a"}]),
     "mark a given twice"),
    (scenario(steps=[{**GOOD_STEP, "mark": "a"}], timings={"t": ["a", "b"]}),
     "timings.t: no step is marked b (marks: a)"),
    (scenario(steps=[{**GOOD_STEP, "mark": "a"}, {**GOOD_STEP, "mark": "b"}],
              timings={"t": ["b", "a"]}), "timings.t: mark b must come before a"),
    (scenario(steps=[{**GOOD_STEP, "mark": "Not A Name"}]), "steps.0.mark"),
])
def test_errors_name_the_field(raw: dict[str, Any], field: str) -> None:
    with pytest.raises(ScenarioError, match="scenario") as caught:
        parse_scenario(raw, origin="s.yaml")
    assert field in str(caught.value)


def test_config_overrides_are_validated() -> None:
    bad = parse_scenario(scenario(config={"controller": {"breaker": {"max_unhealthy": "x"}}}))
    with pytest.raises(ScenarioError, match=r"config: controller\.breaker\.max_unhealthy"):
        build_config(bad)


def test_steps_must_name_nodes_that_exist() -> None:
    s = parse_scenario(scenario(steps=[GOOD_STEP, {"cordon": "gpu-node-5"}]))
    with pytest.raises(ScenarioError, match=r"steps\.1\.cordon: no node 'gpu-node-5' in a "
                                            r"3-node cluster"):
        check_fits(s, 3)


@pytest.mark.parametrize(("text", "message"), [
    ("name: [unclosed", "is not valid YAML"),
    ("- a list", "expected a mapping"),
    ("name: s\nsteps:\n  - cordon: gpu-node-9\n", "no node 'gpu-node-9'"),
])
def test_the_command_refuses_bad_files(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       text: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    assert main(["demo", "--scenario", str(path)]) == 78
    assert message in capsys.readouterr().err


def test_an_unknown_scenario_lists_the_bundled_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--scenario", "no-such-story"]) == 78
    assert "fault-tolerance" in capsys.readouterr().err
