"""Configuration: one YAML file plus a few environment overrides, loaded into frozen,
typed models and validated once at start.

Errors name the field and the fix (`checks.pciebw.params.min_fraction: Input should
be less than or equal to 1`). `healthd config validate FILE` runs the same code
offline. Only this module reads the environment; everything else gets the built
`Config` passed down.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import (
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

import checks
from checks.base import Check, Severity
from checks.catalog import Catalog, Override, RaiseRule, is_known_code
from checks.probes import Probes
from healthd.config.agent import AgentSettings, cron_expression
from healthd.config.controller import ControllerSettings
from healthd.config.selection import parse_selection
from healthd.kube.conventions import DEFAULT_LABEL_PREFIX, DEFAULT_OWN_PREFIX
from healthd.util.durations import Duration, Interval
from healthd.util.exits import EX_CONFIG, ExitError
from healthd.util.models import Frozen
from healthd.util.validation import UnreadableYaml, explain, read_yaml_file

ENV_OVERRIDES = {
    "NODE_NAME": "node_name",
    "POD_NAME": "pod_name",
    "POD_NAMESPACE": "namespace",
}

# The runtime class of the agent's own pod, for its diagnostic Jobs: the overlay that
# sets one on the agent sets this beside it, so both change in one place.
DIAGNOSTIC_RUNTIME_CLASS_ENV = "DIAGNOSTIC_RUNTIME_CLASS"


class CodeOverride(Frozen):
    severity: Severity | None = None
    sticky: bool | None = None
    raise_seen: int | None = Field(
        None, ge=1, le=100, description="raise after this many sightings in raise_runs runs")
    raise_runs: int | None = Field(
        None, ge=1, le=100, description="the window of runs raise_seen counts in")

    @model_validator(mode="after")
    def _whole_rule(self) -> CodeOverride:
        if (self.raise_seen is None) != (self.raise_runs is None):
            raise ValueError("give both raise_seen and raise_runs, or neither")
        if self.raise_seen is not None and self.raise_runs is not None \
                and self.raise_seen > self.raise_runs:
            raise ValueError(f"raise_seen ({self.raise_seen}) cannot exceed raise_runs "
                             f"({self.raise_runs})")
        return self

    def override(self) -> Override:
        rule = None
        if self.raise_seen is not None and self.raise_runs is not None:
            rule = RaiseRule(self.raise_seen, self.raise_runs)
        return Override(self.severity, self.sticky, rule)

    @field_validator("severity")
    @classmethod
    def _ordered_only(cls, value: Severity | None) -> Severity | None:
        if value is not None and not value.ordered:
            raise ValueError("severity must be one of PASS, WARN, ERR, EVICT")
        return value


class CheckConfig(Frozen):
    """One check's schedule and parameters. Unset interval/timeout: the check's default."""

    enabled: bool = True
    interval: Interval | None = None
    cron: str | None = Field(None, description="cron expression, instead of interval")
    timeout: Duration | None = None
    params: dict[str, Any] = {}

    @field_validator("cron")
    @classmethod
    def _valid_cron(cls, value: str | None) -> str | None:
        return cron_expression(value)


class Config(Frozen):
    node_name: str = ""
    pod_name: str = ""  # the controller's Lease holder identity (POD_NAME)
    namespace: str = "healthd-system"
    expected_gpus: int | None = Field(None, ge=0, le=64)
    label_prefix: str = DEFAULT_LABEL_PREFIX
    own_prefix: str = DEFAULT_OWN_PREFIX
    codes: dict[str, CodeOverride] = {}
    checks: dict[str, CheckConfig] = {}
    agent: AgentSettings = AgentSettings()
    controller: ControllerSettings = ControllerSettings()

    @property
    def probe_namespace(self) -> str:
        """Where the agent creates what it creates (diagnostic Jobs, the pvc probe's
        PVCs and pods): a namespace of its own, whose Roles and admission policy
        allow exactly that (deploy/daemonset/base/probe-policy.yaml)."""
        return self.agent.deep_diagnostics.namespace

    @field_validator("codes")
    @classmethod
    def _known_codes(cls, codes: dict[str, CodeOverride]) -> dict[str, CodeOverride]:
        unknown = sorted(c for c in codes if not is_known_code(c))
        if unknown:
            raise ValueError(
                f"unknown finding code(s) {', '.join(unknown)}: use a code from the catalog "
                "(e.g. REMAP_PENDING, XID_79, DCGM_PCIE)"
            )
        return codes

    @field_validator("label_prefix", "own_prefix")
    @classmethod
    def _prefix_shape(cls, prefix: str) -> str:
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?/", prefix):
            raise ValueError("must be a DNS subdomain followed by '/', e.g. healthd.io/")
        return prefix

    @field_validator("checks")
    @classmethod
    def _checks_and_params(cls, sections: dict[str, CheckConfig]) -> dict[str, CheckConfig]:
        """Every unknown check and bad params, with the other sections' errors (a
        field validator runs beside them, where a model validator would wait)."""
        problems = []
        for name, section in sections.items():
            check = checks.REGISTRY.get(name)
            if check is None:
                known = ", ".join(sorted(checks.REGISTRY))
                problems.append(f"checks.{name}: unknown check; known checks: {known}")
                continue
            try:
                check.Params.model_validate(section.params)
            except ValidationError as exc:
                problems.append(f"checks.{name}.params: {explain(exc)}")
        if problems:
            raise ValueError("; ".join(problems))
        return sections

    @model_validator(mode="after")
    def _diagnostics_build(self) -> Config:
        """Each scheduled diagnostic's argument with its check's params, by the rule
        `healthd check --checks dcgm:9` uses: a bad one fails here, not at 3 a.m."""
        for index, entry in enumerate(self.agent.diagnostics):
            (selected,) = parse_selection(entry.check, checks.REGISTRY)  # one, known
            try:
                self.build_check(selected.name, selected.arg)
            except ValueError as exc:
                raise ValueError(f"agent.diagnostics.{index}.check: {entry.check}: "
                                 f"{exc}") from None
        return self

    def catalog(self) -> Catalog:
        return Catalog({code: o.override() for code, o in self.codes.items()})

    def check_section(self, name: str) -> CheckConfig:
        return self.checks.get(name, CheckConfig())

    def build_check(self, name: str, arg: str | None = None, *,
                    probes: Probes | None = None) -> Check:
        """An instance of check `name` with the configured params, plus the command-line
        argument (`dcgm:3` sets the check's ARG parameter), measuring with `probes`
        (None: the real thing)."""
        cls = checks.REGISTRY[name]
        params = dict(self.check_section(name).params)
        if arg is not None:
            if cls.ARG is None:
                raise ValueError(f"check {name} takes no argument (got {name}:{arg})")
            params[cls.ARG] = arg
        try:
            return cls(cls.Params.model_validate(params), probes=probes)
        except ValidationError as exc:
            raise ValueError(f"check {name}: {explain(exc)}") from None


class ConfigError(ValueError):
    """A config that cannot be used; the message names the field and the fix."""


def load_config(path: str | Path | None = None, env: Mapping[str, str] | None = None) -> Config:
    """Build the config from a YAML file (None: defaults) and the environment."""
    raw: Any = {}
    if path is not None:
        try:
            raw = read_yaml_file(Path(path), "config") or {}
        except UnreadableYaml as exc:
            raise ConfigError(str(exc)) from exc
        if not isinstance(raw, dict):
            raise ConfigError(f"config {path}: expected a mapping at the top level")
    env = os.environ if env is None else env
    for var, field_name in ENV_OVERRIDES.items():
        if env.get(var):
            raw[field_name] = env[var]
    for var, (name, param) in check_env().items():
        if env.get(var):
            _set_nested(raw, ("checks", name, "params", param), env[var])
    if env.get(DIAGNOSTIC_RUNTIME_CLASS_ENV):
        _set_nested(raw, ("agent", "deep_diagnostics", "runtime_class"),
                    env[DIAGNOSTIC_RUNTIME_CLASS_ENV])
    try:
        return Config.model_validate(raw)
    except RecursionError:
        raise ConfigError(f"config {path or 'defaults'}: nested too deeply") from None
    except ValidationError as exc:
        origin = path or "defaults"
        raise ConfigError(f"config {origin}: {explain(exc)}") from exc


def add_config_argument(parser: argparse.ArgumentParser,
                        help: str = "healthd config YAML") -> None:
    """`--config FILE`, as every command that reads the config spells it."""
    parser.add_argument("--config", metavar="FILE", help=help)


def config_or_exit(path: str | None) -> Config:
    """The config file (or the defaults) for a command; ExitError(EX_CONFIG) naming what
    is wrong."""
    try:
        return load_config(path)
    except ConfigError as exc:
        raise ExitError(str(exc), EX_CONFIG) from exc


def check_env() -> dict[str, tuple[str, str]]:
    """The environment variables checks read a parameter from (their `ENV`), each
    with its check and parameter: the DCGM host engine from the pod, which
    Kubernetes expands from `$(HOST_IP):5555` where a config file cannot (see
    deploy/daemonset/overlays/gpu-operator)."""
    return {var: (name, param) for name, cls in checks.REGISTRY.items()
            for var, param in cls.ENV.items()}


def _set_nested(raw: dict[str, Any], path: tuple[str, ...], value: str) -> None:
    """`raw[path[0]]...[path[-1]] = value`, making the sections on the way; a section
    of the wrong shape is left for validation to name."""
    section: Any = raw
    for key in path[:-1]:
        section = section.setdefault(key, {}) if isinstance(section, dict) else None
    if isinstance(section, dict):
        section[path[-1]] = value
