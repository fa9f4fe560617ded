"""What `dcgmi diag -j` said: one parsed report for DCGM 3.x and 4.x alike.

`parse_diag_output(stdout, exit_code)` is pure and never raises: anything it cannot
read becomes a report with `outcome == "error"` and a reason. It accepts

- DCGM 4.x: `{"DCGM Diagnostic": {"test_categories": [{"tests": [{"name": "pcie",
  "results": [{"entity_group": "GPU", "entity_id": 0, "status": "Fail",
  "warnings": [{"warning", "error_id", "error_category", "error_severity"}]}],
  "test_summary": {...}}]}]}, "metadata": {"version": ...}}`;
- DCGM 3.x: `{"DCGM GPU Diagnostic": {...}, "version": ...}` with `gpu_id` strings and
  display names ("PCIe", "GPU Memory", "Targeted Stress", ...);
- the `--iterations N` wrapper `{"iterations": [<report>, ...]}`;
- log lines around the JSON, even ones with braces or partial JSON of their own:
  every JSON object in the output is a candidate, and the report is the first one
  with a report's top-level keys that reads as a report (a log line never hides a
  failure).

Test names are normalised onto the 4.x plugin names in upper snake case, so the same
fault gives the same finding code on both versions (`GPU Memory` and `memory` are both
MEMORY). The 3.x deployment sub-tests (Denylist, Persistence Mode, Page
Retirement/Row Remap, ...) are all parts of the single 4.x `software` test: SOFTWARE.

Exit status (`dcgmReturn_t & 0xFF`): 0 all passed, 226 a test failed
(DCGM_ST_NVVS_ERROR), 205 a failure DCGM rates as "isolate the GPU"
(DCGM_ST_NVVS_ISOLATE_ERROR); anything else means the diagnostic did not run.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal, NoReturn

EXIT_PASS = 0
EXIT_FAIL = 226
EXIT_ISOLATE = 205

_EXIT_MEANING = {
    203: "the diagnostic was killed (DCGM_ST_NVVS_KILLED)",
    254: "dcgmi rejected its arguments",
}

# dcgmErrorSeverity_t (dcgm_errors.h)
DCGM_SEVERITY_NAMES = {
    0: "NONE",
    1: "MONITOR",
    2: "ISOLATE",
    3: "UNKNOWN",
    4: "TRIAGE",
    5: "CONFIG",
    6: "RESET",
}
SEVERITY_ISOLATE = 2

Outcome = Literal["pass", "fail", "isolate", "error"]
Status = Literal["pass", "fail", "warn", "skip"]

# 3.x display names (lower case) that do not normalise to the 4.x plugin name by
# themselves. Everything else is upper-snaked as is ("Targeted Stress" -> TARGETED_STRESS).
_ALIASES = {
    "gpu memory": "MEMORY",
    "sm stress": "SM_STRESS",
    "sm perf": "SM_STRESS",
    "nvlink": "NVLINK",
    "memtest": "MEMTEST",
    "pulse": "PULSE_TEST",
    "pulse test": "PULSE_TEST",
    # The 3.x deployment sub-tests, all inside the 4.x `software` test.
    "denylist": "SOFTWARE",
    "blacklist": "SOFTWARE",
    "nvml library": "SOFTWARE",
    "cuda main library": "SOFTWARE",
    "cuda toolkit libraries": "SOFTWARE",
    "permissions and os-related blocks": "SOFTWARE",
    "permissions and os blocks": "SOFTWARE",
    "persistence mode": "SOFTWARE",
    "environmental variables": "SOFTWARE",
    "environment variables": "SOFTWARE",
    "page retirement/row remap": "SOFTWARE",
    "page retirement": "SOFTWARE",
    "graphics processes": "SOFTWARE",
    "inforom": "SOFTWARE",
    "fabric manager": "SOFTWARE",
}

_V4_KEY = "DCGM Diagnostic"
_V3_KEY = "DCGM GPU Diagnostic"


def normalise_test_name(name: str) -> str:
    """DCGM test name (4.x plugin or 3.x display name) -> upper snake (`MEMORY`)."""
    key = " ".join(name.strip().lower().split())
    if key in _ALIASES:
        return _ALIASES[key]
    return re.sub(r"[^A-Z0-9]+", "_", key.upper()).strip("_") or "UNNAMED"


@dataclass(frozen=True)
class DiagWarning:
    """One DCGM error: its text and DCGM's own classification (`DCGM_FR_*` id,
    category, severity), any of which older versions may leave out."""

    text: str
    error_id: int | None = None
    error_category: int | None = None
    error_severity: int | None = None

    @property
    def severity_name(self) -> str:
        if self.error_severity is None:
            return ""
        return DCGM_SEVERITY_NAMES.get(self.error_severity, str(self.error_severity))


@dataclass(frozen=True)
class DiagResult:
    """One test's result on one entity. `gpu` is None when the result is about
    something else (the CPU, the whole node, a test summary)."""

    test: str  # normalised: MEMORY, PCIE, ...
    test_name: str  # as DCGM wrote it
    status: Status
    gpu: int | None
    entity: str = ""  # the non-GPU entity, e.g. "CPU 0"
    warnings: tuple[DiagWarning, ...] = ()
    info: tuple[str, ...] = ()


@dataclass(frozen=True)
class DiagReport:
    """A parsed `dcgmi diag` run. `error` says why it could not tell (then
    `outcome == "error"`, except for exit 205, which is an answer by itself)."""

    exit_code: int
    outcome: Outcome
    version: str = ""
    driver_version: str = ""
    results: tuple[DiagResult, ...] = ()
    error: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def failures(self) -> tuple[DiagResult, ...]:
        return tuple(r for r in self.results if r.status == "fail")

    @property
    def gpus(self) -> tuple[int, ...]:
        """Every GPU the report names, in order."""
        return tuple(sorted({r.gpu for r in self.results if r.gpu is not None}))

    def isolate_gpus(self) -> tuple[int, ...]:
        """The GPUs DCGM wants isolated: those with an ISOLATE-severity failure, or
        every failing GPU when no failure carries a severity that says so."""
        failing = [r for r in self.failures if r.gpu is not None]
        rated = [r for r in failing if _is_isolate(r)]
        return tuple(sorted({r.gpu for r in (rated or failing) if r.gpu is not None}))


def _is_isolate(result: DiagResult) -> bool:
    return any(w.error_severity == SEVERITY_ISOLATE for w in result.warnings)


class _Unreadable(ValueError):
    """The output is not a DCGM diagnostic report."""


def parse_diag_output(stdout: str, exit_code: int) -> DiagReport:
    """Parse `dcgmi diag -j` output and exit status into a report. Never raises."""
    try:
        version, driver, results, runtime_error = _read_report(stdout)
    except _Unreadable as exc:
        return _unreadable(exit_code, str(exc))
    if runtime_error:
        return DiagReport(exit_code, "error", version, driver, error=f"DCGM: {runtime_error}")
    return _with_outcome(DiagReport(exit_code, "pass", version, driver, tuple(results)))


def _unreadable(exit_code: int, why: str) -> DiagReport:
    if exit_code == EXIT_ISOLATE:
        # The exit status alone is DCGM's verdict: isolate, even without details.
        return DiagReport(exit_code, "isolate", error=why)
    return DiagReport(exit_code, "error", error=_exit_reason(exit_code, why))


def _with_outcome(report: DiagReport) -> DiagReport:
    code = report.exit_code
    if code == EXIT_ISOLATE:
        return replace(report, outcome="isolate")
    if code == EXIT_FAIL:
        if not report.failures:
            return replace(
                report, outcome="error", error=_exit_reason(code, "no failed test named")
            )
        return replace(report, outcome="fail")
    if code == EXIT_PASS:
        return replace(report, outcome="fail" if report.failures else "pass")
    return replace(report, outcome="error", error=_exit_reason(code, ""))


def _exit_reason(code: int, detail: str) -> str:
    if code == EXIT_FAIL:
        what = "dcgmi exited 226 (tests failed)"
    elif code < 0:
        what = f"dcgmi was killed by signal {-code}"
    elif code in (EXIT_PASS, EXIT_ISOLATE):
        what = f"dcgmi exited {code}"
    else:
        what = f"dcgmi exited {code}: " + _EXIT_MEANING.get(code, "the diagnostic did not run")
    return f"{what}; {detail}" if detail else what


def _read_report(stdout: str) -> tuple[str, str, list[DiagResult], str]:
    """The first candidate in `stdout` that reads as a report (see `_candidates`);
    none does: why the most likely one did not."""
    first: _Unreadable | None = None
    for doc in _candidates(stdout):
        try:
            return _read_document(doc)
        except _Unreadable as exc:
            first = first or exc
    if first is not None:
        raise first
    start, end = stdout.find("{"), stdout.rfind("}")
    if start < 0 or end < start:
        return _raise("no JSON in the output" if stdout.strip() else "empty output")
    try:
        json.loads(stdout[start : end + 1])
    except (ValueError, RecursionError) as exc:
        return _raise(f"output is not valid JSON ({exc})")
    return _raise("output is not a JSON object")


def _candidates(stdout: str) -> list[dict[str, Any]]:
    """Every JSON object in `stdout` (or nested in one, for a log line that wraps the
    report) with a report's top-level keys, then one with a runtime error alone, then
    the first object at all (whose missing keys `_section` names)."""
    objects = list(_json_objects(stdout))
    out: list[dict[str, Any]] = []
    for keys in (_REPORT_KEYS, ("runtime_error",)):
        out.extend(found for doc in objects if (found := _with_keys(doc, keys)) is not None)
    return out + objects[:1]


_REPORT_KEYS = (_V4_KEY, _V3_KEY, "iterations")
_DECODER = json.JSONDecoder()
_MAX_NESTING = 4  # how deep inside a log line's JSON a report is looked for


def _json_objects(text: str) -> Iterable[dict[str, Any]]:
    """Every JSON object in `text` that parses, left to right; one that parses is not
    searched again for smaller ones (its nested objects are, by `_with_keys`)."""
    at = text.find("{")
    while at >= 0:
        try:
            value, end = _DECODER.raw_decode(text, at)
        except (ValueError, RecursionError):
            at = text.find("{", at + 1)
            continue
        if isinstance(value, dict):
            yield value
        at = text.find("{", end)


def _with_keys(doc: Any, keys: Iterable[str], depth: int = 0) -> dict[str, Any] | None:
    """`doc`, or the first object nested in it, that has one of `keys` at its top."""
    if not isinstance(doc, dict) or depth > _MAX_NESTING:
        return None
    if any(key in doc for key in keys):
        return doc
    for value in doc.values():
        if (found := _with_keys(value, keys, depth + 1)) is not None:
            return found
    return None


def _raise(why: str) -> NoReturn:
    raise _Unreadable(why)


def _read_document(doc: Any) -> tuple[str, str, list[DiagResult], str]:
    """(version, driver version, results, runtime error) of a report or of the
    iterations wrapper."""
    if not isinstance(doc, dict):
        _raise("output is not a JSON object")
    if isinstance(doc.get("iterations"), list):
        parts = [_read_document(it) for it in doc["iterations"]]
        if not parts:
            _raise("no iterations in the output")
        results = [r for part in parts for r in part[2]]
        errors = "; ".join(p[3] for p in parts if p[3])
        return parts[0][0], parts[0][1], results, errors
    section, is_v4 = _section(doc)
    raw_meta = doc.get("metadata")
    meta: dict[str, Any] = raw_meta if isinstance(raw_meta, dict) else doc
    version = _text(meta.get("version") or doc.get("version"))
    driver = _text(meta.get("Driver Version Detected") or doc.get("Driver Version Detected"))
    runtime_error = _text(section.get("runtime_error") or doc.get("runtime_error"))
    results = list(_read_categories(section.get("test_categories"), is_v4))
    if not results and not runtime_error:
        _raise("the report lists no test results")
    return version, driver, results, runtime_error


def _section(doc: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    for key, is_v4 in ((_V4_KEY, True), (_V3_KEY, False)):
        if isinstance(doc.get(key), dict):
            return doc[key], is_v4
    if "runtime_error" in doc:
        return {}, True
    _raise(f"neither {_V4_KEY!r} nor {_V3_KEY!r} in the output")


def _read_categories(categories: Any, is_v4: bool) -> Iterable[DiagResult]:
    for category in _dicts(categories):
        for test in _dicts(category.get("tests")):
            yield from _read_test(test, is_v4)


def _read_test(test: dict[str, Any], is_v4: bool) -> list[DiagResult]:
    name = _text(test.get("name")) or "unnamed"
    normalised = normalise_test_name(name)
    read = _read_v4_result if is_v4 else _read_v3_result
    results = [read(normalised, name, raw) for raw in _dicts(test.get("results"))]
    summary = test.get("test_summary")
    if not isinstance(summary, dict):
        return results
    if _status(summary.get("status")) == "fail" and not any(r.status == "fail" for r in results):
        # A failure DCGM did not pin on an entity: it is about the node.
        results.append(_result(normalised, name, summary, gpu=None, entity="node"))
    return results


def _read_v4_result(test: str, name: str, raw: dict[str, Any]) -> DiagResult:
    group = _text(raw.get("entity_group")) or "GPU"
    entity_id = _int(raw.get("entity_id"))
    if group.upper() == "GPU" and entity_id is not None:
        return _result(test, name, raw, gpu=entity_id)
    suffix = f" {entity_id}" if entity_id is not None else ""
    return _result(test, name, raw, gpu=None, entity=f"{group}{suffix}")


def _read_v3_result(test: str, name: str, raw: dict[str, Any]) -> DiagResult:
    gpu = _int(raw.get("gpu_id"))
    return _result(test, name, raw, gpu=gpu, entity="" if gpu is not None else "node")


def _result(
    test: str, name: str, raw: dict[str, Any], *, gpu: int | None, entity: str = ""
) -> DiagResult:
    return DiagResult(
        test=test,
        test_name=name,
        status=_status(raw.get("status")),
        gpu=gpu,
        entity=entity,
        warnings=tuple(_warnings(raw.get("warnings"))),
        info=tuple(_info(raw.get("info"))),
    )


def _status(value: Any) -> Status:
    text = _text(value).strip().lower()
    if text in ("fail", "failed", "error"):
        return "fail"
    if text in ("warn", "warning"):
        return "warn"
    if text in ("pass", "passed"):
        return "pass"
    return "skip"  # Skip, Not Run, anything unknown: no verdict either way


def _warnings(value: Any) -> Iterable[DiagWarning]:
    items = value if isinstance(value, list) else [value] if value else []
    for item in items:
        if isinstance(item, dict):
            yield DiagWarning(
                text=_text(item.get("warning") or item.get("message")),
                error_id=_int(item.get("error_id")),
                error_category=_int(item.get("error_category")),
                error_severity=_int(item.get("error_severity")),
            )
        elif isinstance(item, str) and item.strip():
            yield DiagWarning(text=item)


def _info(value: Any) -> Iterable[str]:
    items = value if isinstance(value, list) else [value]
    return (_text(i) for i in items if isinstance(i, str) and i.strip())


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _text(value: Any) -> str:
    return " ".join(value.split()) if isinstance(value, str) else ""


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    return None
