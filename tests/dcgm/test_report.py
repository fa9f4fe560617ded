"""The pure parser of `dcgmi diag -j` output and the judging of a parsed report:
name normalisation across DCGM 3.x and 4.x, exit statuses, the iterations wrapper,
failures not pinned on a GPU, every recorded output, and that no input crashes it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from checks.base import Severity
from checks.catalog import Catalog
from checks.dcgm import judge_report, normalise_test_name, parse_diag_output
from healthd.sim.dcgm import FAKE_DCGMI, recorded_names


@pytest.mark.parametrize(
    ("name", "code"),
    [
        ("pcie", "PCIE"),
        ("PCIe", "PCIE"),
        ("memory", "MEMORY"),
        ("GPU Memory", "MEMORY"),
        ("Memory Bandwidth", "MEMORY_BANDWIDTH"),
        ("memory_bandwidth", "MEMORY_BANDWIDTH"),
        ("Targeted Stress", "TARGETED_STRESS"),
        ("targeted_power", "TARGETED_POWER"),
        ("SM Stress", "SM_STRESS"),
        ("NVLink", "NVLINK"),
        ("Diagnostic", "DIAGNOSTIC"),
        ("Denylist", "SOFTWARE"),
        ("Blacklist", "SOFTWARE"),
        ("Page Retirement/Row Remap", "SOFTWARE"),
        ("software", "SOFTWARE"),
        ("nvbandwidth", "NVBANDWIDTH"),
        ("  ", "UNNAMED"),
    ],
)
def test_test_names_normalise_onto_the_4x_names(name: str, code: str) -> None:
    assert normalise_test_name(name) == code


def _v4(*tests: dict[str, Any], version: str = "4.2.3") -> dict[str, Any]:
    return {
        "DCGM Diagnostic": {"test_categories": [{"category": "X", "tests": list(tests)}]},
        "metadata": {"version": version},
    }


def _test(name: str, *results: dict[str, Any], summary: str | None = None) -> dict[str, Any]:
    test: dict[str, Any] = {"name": name, "results": list(results)}
    if summary:
        test["test_summary"] = {"status": summary, "warnings": [{"warning": "link trained down"}]}
    return test


def _gpu(index: int, status: str = "Pass", **extra: Any) -> dict[str, Any]:
    return {"entity_group": "GPU", "entity_id": index, "status": status, **extra}


def _fail_text(text: str, error_id: int = 45, severity: int = 1) -> dict[str, Any]:
    warning = {"warning": text, "error_id": error_id, "error_category": 13}
    return {"warnings": [{**warning, "error_severity": severity}]}


def test_exit_zero_with_only_passes_is_pass() -> None:
    report = parse_diag_output(json.dumps(_v4(_test("pcie", _gpu(0), _gpu(1)))), 0)
    assert (report.outcome, report.gpus, report.version) == ("pass", (0, 1), "4.2.3")


def test_226_names_the_failures() -> None:
    doc = _v4(_test("pcie", _gpu(0), _gpu(1, "Fail", **_fail_text("gen 3 < 5"))))
    report = parse_diag_output(json.dumps(doc), 226)
    assert report.outcome == "fail"
    (failed,) = report.failures
    assert (failed.test, failed.gpu, failed.warnings[0].error_id) == ("PCIE", 1, 45)


def test_226_without_a_failed_test_cannot_tell() -> None:
    report = parse_diag_output(json.dumps(_v4(_test("pcie", _gpu(0)))), 226)
    assert report.outcome == "error"
    assert "no failed test" in report.error


def test_a_failure_is_believed_even_with_exit_zero() -> None:
    doc = _v4(_test("memory", _gpu(2, "Fail")))
    assert parse_diag_output(json.dumps(doc), 0).outcome == "fail"


@pytest.mark.parametrize(
    ("stdout", "exit_code", "why"),
    [
        ("", 0, "empty output"),
        ("Error: host engine not running", 0, "no JSON"),
        ("{broken", 226, "no JSON"),
        ("{ not json }", 0, "not valid JSON"),
        ("[1, 2]", 0, "no JSON"),
        ('{"something": "else"}', 0, "neither"),
        (json.dumps(_v4()), 0, "no test results"),
        (json.dumps(_v4(_test("pcie", _gpu(0)))), 1, "dcgmi exited 1"),
        (json.dumps(_v4(_test("pcie", _gpu(0)))), -9, "killed by signal 9"),
        (json.dumps(_v4(_test("pcie", _gpu(0)))), 254, "rejected its arguments"),
    ],
)
def test_unreadable_or_unexpected_is_an_error(stdout: str, exit_code: int, why: str) -> None:
    report = parse_diag_output(stdout, exit_code)
    assert report.outcome == "error"
    assert why in report.error


def test_runtime_error_wins_over_the_exit_status() -> None:
    doc = {"DCGM Diagnostic": {"runtime_error": "cannot reach the host engine"}}
    report = parse_diag_output(json.dumps(doc), 226)
    assert report.outcome == "error"
    assert "cannot reach the host engine" in report.error


def test_205_with_unreadable_output_still_isolates_the_node() -> None:
    report = parse_diag_output("Segmentation fault", 205)
    assert report.outcome == "isolate"
    result = judge_report(report, Catalog(), level=3, node_name="n1")
    (finding,) = result.findings
    assert (finding.code, finding.entity.label, finding.severity) == (
        "DCGM_ISOLATE",
        "node",
        Severity.EVICT,
    )


def test_isolate_targets_isolate_severity_failures_only() -> None:
    doc = _v4(
        _test("pcie", _gpu(0, "Fail", **_fail_text("replays", 107, severity=2))),
        _test("targeted_stress", _gpu(1, "Fail", **_fail_text("slow", 50, severity=1))),
    )
    report = parse_diag_output(json.dumps(doc), 205)
    assert report.isolate_gpus() == (0,)
    result = judge_report(report, Catalog(), level=3)
    codes = {(f.code, f.entity.label) for f in result.findings}
    assert codes == {
        ("DCGM_ISOLATE", "gpu0"),
        ("DCGM_PCIE", "gpu0"),
        ("DCGM_TARGETED_STRESS", "gpu1"),
    }


def test_iterations_wrapper_merges_every_iteration() -> None:
    first = _v4(_test("memory", _gpu(0), _gpu(1)))
    second = _v4(_test("memory", _gpu(0), _gpu(1, "Fail")))
    doc = {"iterations": [first, second], "Overall Result": "Fail"}
    report = parse_diag_output(json.dumps(doc), 226)
    assert report.outcome == "fail"
    assert [(r.test, r.gpu) for r in report.failures] == [("MEMORY", 1)]


def test_failure_on_a_cpu_entity_is_about_the_node() -> None:
    cpu = {"entity_group": "CPU", "entity_id": 0, "status": "Fail", "warnings": ["EUD failed"]}
    report = parse_diag_output(json.dumps(_v4(_test("cpu_eud", cpu))), 226)
    result = judge_report(report, Catalog(), level=3, node_name="n1")
    (finding,) = result.findings
    assert (finding.code, finding.entity.kind) == ("DCGM_CPU_EUD", "node")
    assert finding.values["dcgm_entity"] == "CPU 0"


def test_failed_summary_without_a_failed_entity_is_about_the_node() -> None:
    doc = _v4(_test("nvlink", _gpu(0), _gpu(1), summary="Fail"))
    result = judge_report(parse_diag_output(json.dumps(doc), 226), Catalog(), level=2)
    (finding,) = result.findings
    assert (finding.code, finding.entity.kind, finding.severity) == (
        "DCGM_NVLINK",
        "node",
        Severity.EVICT,
    )
    assert "link trained down" in finding.message


def test_gpu_whose_every_test_skipped_is_skipped() -> None:
    doc = _v4(_test("nvbandwidth", _gpu(0, "Skip"), _gpu(1)))
    result = judge_report(parse_diag_output(json.dumps(doc), 0), Catalog(), level=3)
    status = {e.entity.label: e.status for e in result.entities}
    assert status == {"gpu0": Severity.SKIPPED, "gpu1": Severity.PASS}


def test_v3_results_use_gpu_id_strings() -> None:
    doc = {
        "version": "3.3.9",
        "DCGM GPU Diagnostic": {
            "test_categories": [
                {
                    "category": "Hardware",
                    "tests": [
                        {
                            "name": "GPU Memory",
                            "results": [
                                {"gpu_id": "0", "status": "Pass"},
                                {
                                    "gpu_id": "3",
                                    "status": "Fail",
                                    "info": "bad",
                                    "warnings": [
                                        {
                                            "warning": "row remap failed",
                                            "error_id": 80,
                                            "error_severity": 2,
                                        }
                                    ],
                                },
                            ],
                        }
                    ],
                },
            ]
        },
    }
    report = parse_diag_output(json.dumps(doc), 226)
    (failed,) = report.failures
    assert (report.version, failed.test, failed.gpu, failed.info) == (
        "3.3.9",
        "MEMORY",
        3,
        ("bad",),
    )


@pytest.mark.parametrize("name", sorted(recorded_names()))
def test_every_recording_parses_as_its_exit_status_says(name: str) -> None:
    entry = recorded_names()[name]
    text = (FAKE_DCGMI.parent / "outputs" / str(entry["file"])).read_text()
    report = parse_diag_output(text, int(str(entry["exit"])))
    expected = {0: "pass", 226: "fail", 205: "isolate"}[int(str(entry["exit"]))]
    if name in ("garbage", "v4-runtime-error"):
        expected = "error"
    assert report.outcome == expected


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "DCGM Diagnostic",
                    "DCGM GPU Diagnostic",
                    "test_categories",
                    "tests",
                    "results",
                    "name",
                    "status",
                    "gpu_id",
                    "entity_id",
                    "entity_group",
                    "warnings",
                    "iterations",
                    "test_summary",
                    "runtime_error",
                    "metadata",
                    "version",
                    "error_id",
                    "info",
                ]
            ),
            children,
            max_size=5,
        )
    ),
    max_leaves=30,
)


@settings(max_examples=150, deadline=None)
@given(doc=_json, exit_code=st.sampled_from([0, 1, 205, 226, -9]))
def test_no_json_shape_crashes_the_parser_or_the_judge(doc: Any, exit_code: int) -> None:
    report = parse_diag_output(json.dumps(doc), exit_code)
    result = judge_report(report, Catalog(), level=1)
    assert (result.status is Severity.UNKNOWN) == (report.outcome == "error")


@settings(max_examples=100, deadline=None)
@given(text=st.text(max_size=200))
def test_no_text_crashes_the_parser(text: str) -> None:
    assert parse_diag_output(text, 0).outcome in ("pass", "fail", "error")


# -- noise around a recorded report ------------------------------------------------------

_NOISE_LINES = st.sampled_from([
    "",
    "Successfully ran diagnostic for group.",
    '{"level": "info", "msg": "diagnostic started"}',
    '{"level": "warn", "msg": "plugin {pcie} slow"',  # partial JSON
    "config: {gpus: [0, 1], level: 3}",
    "}{",
    "{{{",
    '{"DCGM Diagnostic": "truncated',  # the start of a report that never ends
    '[{"a": 1}]',
    '{"DCGM Diagnostic": {"test_categories": []}',  # an unclosed, empty report
    "Error: a previous run left {stale} state",
])
_noise = st.lists(st.one_of(_NOISE_LINES, st.text(max_size=20)), max_size=4).map("\n".join)


def _recorded() -> list[tuple[str, str, int]]:
    out = []
    for name, entry in sorted(recorded_names().items()):
        if name == "garbage":
            continue
        text = (FAKE_DCGMI.parent / "outputs" / str(entry["file"])).read_text()
        out.append((name, text, int(str(entry["exit"]))))
    return out


@settings(max_examples=200, deadline=None)
@given(recording=st.sampled_from(_recorded()), before=_noise, after=_noise)
def test_noise_around_a_report_changes_nothing(recording: tuple[str, str, int], before: str,
                                               after: str) -> None:
    _name, text, exit_code = recording
    clean = parse_diag_output(text, exit_code)
    noisy = parse_diag_output(f"{before}\n{text}\n{after}", exit_code)
    assert noisy == clean


def test_a_failure_after_a_log_line_with_braces_is_still_a_failure() -> None:
    text = (FAKE_DCGMI.parent / "outputs" / "v4-fail-pcie.json").read_text()
    noisy = '{"ts": 1, "msg": "starting"}\nplugin {pcie} done }\n' + text + '\n{"done": true}'
    report = parse_diag_output(noisy, 0)  # exit 0: only the report says it failed
    assert report.outcome == "fail" and [f.test for f in report.failures] == ["PCIE"]


def test_a_report_wrapped_in_a_log_record_is_found() -> None:
    text = (FAKE_DCGMI.parent / "outputs" / "v4-fail-pcie.json").read_text()
    wrapped = '{"level": "info", "payload": ' + text + "}"
    assert parse_diag_output(wrapped, 226).outcome == "fail"


def test_an_empty_report_in_the_noise_does_not_hide_the_real_one() -> None:
    text = (FAKE_DCGMI.parent / "outputs" / "v4-fail-pcie.json").read_text()
    noisy = '{"DCGM Diagnostic": {"test_categories": []}\n}\n' + text
    assert parse_diag_output(noisy, 226).outcome == "fail"
