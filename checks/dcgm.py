"""The `dcgm` check: NVIDIA DCGM diagnostics (`dcgmi diag -r <level> -j`) judged per GPU.

Shelling out to `dcgmi` is version-tolerant (there is no pip-installable DCGM binding)
and lets a hung diagnostic be killed: the program runs in its own process group,
which dies with the check on timeout or cancellation (see checks.processes).

Judging (the parsing itself is `checks.dcgm_report.parse_diag_output`):
- exit 0: every GPU passed; `Warn` results raise nothing but are kept as a value;
- exit 226: one finding `DCGM_<TEST>` per failed test and GPU (severity from the
  catalog: PCIE, NVLINK, MEMORY, ECC are sticky EVICT, the rest ERR), carrying
  DCGM's own `error_id`, `error_category`, `error_severity` and warning text;
- exit 205: the same findings plus `DCGM_ISOLATE` on every GPU DCGM wants isolated
  (the node when it names none);
- DCGM cannot be used on this node at all (no `dcgmi` in the image, or no host
  engine where it should be): SKIPPED, marked actionable (the agent posts one
  Warning Event saying what to set up), not an UNKNOWN every hour;
- anything else (runtime error, unreadable output, other exit, timeout): UNKNOWN
  with the reason and an excerpt of what dcgmi printed.

`dcgmi` is a client: it asks a host engine (`nv-hostengine`) to run the diagnostic.
`params.host_engine` (HOST or HOST:PORT, passed as `--host`) names a remote one, e.g.
the GPU Operator's node-local `nvidia-dcgm` Service or a host engine on the node's IP;
unset, dcgmi asks `localhost`, i.e. a host engine in the same pod.

Levels 3 and 4 stress the GPUs for minutes to hours, so they need the GPUs to
themselves (`exclusive`); levels 1 and 2 do not.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import ClassVar, cast

from pydantic import BaseModel, ConfigDict, Field, field_validator

from checks.base import (
    AutopilotGauge,
    BaseCheck,
    CheckContext,
    CheckResult,
    Entity,
    ResultBuilder,
    Value,
)
from checks.catalog import Catalog
from checks.dcgm_report import (
    DiagReport,
    DiagResult,
    normalise_test_name,
    parse_diag_output,
)
from checks.processes import ProgramNotFound, ProgramNotRunnable, run_process

__all__ = [
    "LEVEL_TIMEOUTS_S",
    "DcgmCheck",
    "DcgmParams",
    "DiagReport",
    "judge_report",
    "normalise_test_name",
    "parse_diag_output",
]

# Room above the observed durations: level 1 takes seconds, level 2 about 2 min,
# level 3 7-15 min (4 to 8 GPUs), level 4 about 90 min.
LEVEL_TIMEOUTS_S: dict[int, float] = {1: 120.0, 2: 600.0, 3: 1800.0, 4: 7200.0}
EXCLUSIVE_FROM_LEVEL = 3
_MESSAGE_CHARS = 300
_EXCERPT_CHARS = 400
DEFAULT_HOST_ENGINE = "localhost:5555"
# dcgmi's words when no host engine answers at the address (any exit status).
_NO_HOST_ENGINE = re.compile(r"unable to (establish a connection|connect to host engine)",
                             re.IGNORECASE)
_HOST_ENGINE = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9][A-Za-z0-9.-]*)(:(\d{1,5}))?$")
SETUP_HINT = ("install DCGM in the image (Containerfile --build-arg DCGM_IMAGE) and point "
              "checks.dcgm.params.host_engine (or DCGM_HOST_ENGINE) at an nv-hostengine, "
              "or disable the check (checks.dcgm.enabled: false)")


class DcgmParams(BaseModel):
    """Parameters of the dcgm check."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    level: int = Field(default=1, ge=1, le=4, description="dcgmi diag run level (-r)")
    command: list[str] = Field(
        default_factory=lambda: ["dcgmi"],
        min_length=1,
        description="the dcgmi executable and any leading arguments",
    )
    gpus: list[int] | None = Field(
        default=None, description="GPU indices to test (-i); all when unset"
    )
    timeout_s: float | None = Field(
        default=None, gt=0, description="overrides the per-level timeout"
    )
    host_engine: str | None = Field(
        default=None,
        description="the DCGM host engine to ask, HOST or HOST:PORT (dcgmi --host); "
        "unset: localhost",
    )

    @field_validator("host_engine")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        if value is None:
            return None
        match = _HOST_ENGINE.match(value.strip())
        port = match.group(3) if match else None
        if match is None or (port is not None and not 1 <= int(port) <= 65535):
            raise ValueError(f"expected HOST or HOST:PORT (e.g. 10.0.0.5:5555), got {value!r}")
        return value.strip()


class DcgmCheck(BaseCheck):
    NAME: ClassVar[str] = "dcgm"
    Params: ClassVar[type[BaseModel]] = DcgmParams
    ARG: ClassVar[str | None] = "level"
    DEFAULT_INTERVAL_S: ClassVar[float] = 3600.0
    # The longest level's limit, so an outer deadline taken from the class never cuts a
    # run short; each instance enforces its own level's limit (`timeout_s`).
    DEFAULT_TIMEOUT_S: ClassVar[float] = LEVEL_TIMEOUTS_S[4]
    EXCLUSIVE: ClassVar[bool] = False
    DESCRIPTION: ClassVar[str] = "NVIDIA DCGM diagnostics (dcgmi diag), per GPU"
    AUTOPILOT: ClassVar[AutopilotGauge | None] = AutopilotGauge("dcgm", per="node")
    CODES: ClassVar[tuple[str, ...]] = ("DCGM_*", "DCGM_ISOLATE")
    # The pod's host engine (`$(HOST_IP):5555`), handed on to the diagnostic Jobs too.
    ENV: ClassVar[Mapping[str, str]] = {"DCGM_HOST_ENGINE": "host_engine"}

    @property
    def _params(self) -> DcgmParams:
        return cast(DcgmParams, self.params)

    @property
    def level(self) -> int:
        return self._params.level

    @property
    def exclusive(self) -> bool:
        return self.level >= EXCLUSIVE_FROM_LEVEL

    @property
    def labelled_level(self) -> int:
        """A deep run leaves Autopilot's `dcgm.level.N` label for its level."""
        return self.level

    @property
    def timeout_s(self) -> float:
        """This instance's deadline: the param, else the level's default."""
        return self._params.timeout_s or LEVEL_TIMEOUTS_S[self.level]

    def argv(self) -> list[str]:
        """The full command line: `<command> diag [--host H] -r <level> -j [-i 0,1]`."""
        params = self._params
        host = ["--host", params.host_engine] if params.host_engine else []
        argv = [*params.command, "diag", *host, "-r", str(params.level), "-j"]
        if params.gpus:
            argv += ["-i", ",".join(str(g) for g in params.gpus)]
        return argv

    async def run(self, ctx: CheckContext) -> CheckResult:
        argv, level = self.argv(), self.level
        try:
            out = await run_process(argv, timeout_s=self.timeout_s)
        except ProgramNotFound:
            return CheckResult.skipped(
                self.NAME, f"DCGM cannot be used: {argv[0]!r} is not installed; {SETUP_HINT}",
                actionable=True)
        except ProgramNotRunnable as exc:
            return CheckResult.unknown(self.NAME, f"dcgmi cannot be started: {exc}")
        except TimeoutError:
            return CheckResult.unknown(
                self.NAME, f"dcgmi diag -r {level} timed out after {self.timeout_s:g} s (killed)"
            )
        report = parse_diag_output(out.stdout, out.returncode)
        excerpt = excerpt_of(out.stderr) or excerpt_of(out.stdout)
        if report.outcome == "error" and _NO_HOST_ENGINE.search(out.stderr + out.stdout):
            where = self._params.host_engine or DEFAULT_HOST_ENGINE
            return CheckResult.skipped(
                self.NAME, f"DCGM cannot be used: no host engine answers at {where} "
                f"({excerpt}); {SETUP_HINT}", actionable=True)
        return judge_report(
            report, ctx.catalog, level=level, node_name=ctx.node_name, excerpt=excerpt
        )


def judge_report(
    report: DiagReport,
    catalog: Catalog,
    *,
    level: int,
    node_name: str = "",
    excerpt: str = "",
) -> CheckResult:
    """Turn a parsed diagnostic into the check's result (also used by the deep
    diagnostic Job, which runs dcgmi itself). `excerpt` goes into UNKNOWN reasons."""
    if report.outcome == "error":
        reason = report.error + (f": {excerpt}" if excerpt else "")
        return CheckResult.unknown(DcgmCheck.NAME, reason)
    node = Entity.node(node_name)
    builder = ResultBuilder(DcgmCheck.NAME, catalog)
    common: dict[str, Value] = {"level": level, "dcgm_version": report.version or "unknown"}
    for gpu in report.gpus:
        _judge_gpu(builder, Entity.gpu(gpu), [r for r in report.results if r.gpu == gpu], common)
    node_failures = [r for r in report.failures if r.gpu is None]
    for failed in node_failures:
        _fail(builder, node, failed, common)
    if report.outcome == "isolate":
        _isolate(builder, report, node, common)
    if not report.gpus and not node_failures and report.outcome != "isolate":
        builder.seen(node, **common)
    return builder.build(reason=_summary(report, level))


def _judge_gpu(
    builder: ResultBuilder, gpu: Entity, results: list[DiagResult], common: dict[str, Value]
) -> None:
    failed = [r for r in results if r.status == "fail"]
    warned = [r for r in results if r.status == "warn"]
    values = dict(common)
    if warned:
        values["dcgm_warnings"] = _trim("; ".join(_warn_line(r) for r in warned))
    if failed or any(r.status in ("pass", "warn") for r in results):
        builder.seen(gpu, **values)
    else:
        builder.skip(gpu, "every DCGM test skipped this GPU")
    for result in failed:
        _fail(builder, gpu, result, common)


def _fail(
    builder: ResultBuilder, entity: Entity, result: DiagResult, common: dict[str, Value]
) -> None:
    values: dict[str, Value] = {**common, "dcgm_test": result.test_name}
    if result.entity and result.entity != "node":
        values["dcgm_entity"] = result.entity
    first = result.warnings[0] if result.warnings else None
    if first is not None:
        ids = [str(w.error_id) for w in result.warnings if w.error_id is not None]
        optional = {
            "error_id": first.error_id,
            "error_category": first.error_category,
            "error_severity": first.error_severity,
            "dcgm_severity": first.severity_name or None,
            "error_ids": ",".join(ids) if len(ids) > 1 else None,
        }
        values.update({k: v for k, v in optional.items() if v is not None})
    builder.finding(f"DCGM_{result.test}", entity, _failure_message(result, entity), **values)


def _isolate(
    builder: ResultBuilder, report: DiagReport, node: Entity, common: dict[str, Value]
) -> None:
    gpus = report.isolate_gpus()
    targets = [Entity.gpu(g) for g in gpus] or [node]
    for target in targets:
        failed = [r.test_name for r in report.failures if r.gpu == target.index]
        why = f" ({', '.join(failed)} failed)" if failed else ""
        if not report.results:
            why = f" (exit 205; output unreadable: {report.error})"
        builder.finding(
            "DCGM_ISOLATE",
            target,
            f"DCGM asks to isolate {target.label}{why}",
            **common,
        )


def _failure_message(result: DiagResult, entity: Entity) -> str:
    texts = [w.text for w in result.warnings if w.text] or list(result.info)
    detail = "; ".join(texts) or "no detail given"
    return _trim(f"DCGM {result.test_name} failed on {entity.label}: {detail}")


def _warn_line(result: DiagResult) -> str:
    texts = [w.text for w in result.warnings if w.text]
    return f"{result.test}: {'; '.join(texts) or 'warning'}"


def _summary(report: DiagReport, level: int) -> str:
    head = f"DCGM {report.version or '(version unknown)'} level {level}"
    failures = report.failures
    if report.outcome == "isolate":
        return f"{head}: DCGM asks to isolate; {len(failures)} failed test result(s)"
    if failures:
        tests = sorted({r.test for r in failures})
        return f"{head}: failed {', '.join(tests)}"
    return f"{head}: {len(report.gpus)} GPU(s) passed"


def excerpt_of(text: str, limit: int = _EXCERPT_CHARS) -> str:
    """The end of what a program printed, on one line, for UNKNOWN reasons."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else "..." + flat[-limit:]


def _trim(text: str, limit: int = _MESSAGE_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
