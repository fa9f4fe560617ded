"""The `controller:` settings: defaults, durations as strings, breaker thresholds as a
count or a share, and clear errors for values that cannot work."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from healthd.config.controller import ControllerSettings, parse_threshold
from healthd.kube.conventions import Verdict


def test_defaults() -> None:
    s = ControllerSettings()
    assert s.slack_queues == ("slack-cluster-queue",)
    assert s.bad_verdicts == {Verdict.ERR, Verdict.TESTING, Verdict.EVICT}
    assert (s.capacity_source, s.dry_run, s.gpu_resource, s.http_port) == (
        "capacity", False, "nvidia.com/gpu", 9401)
    assert (s.resets.rate_per_minute, s.resets.burst, s.resets.min_spacing) == (60, 10, 300)
    assert (s.breaker.max_unhealthy, s.breaker.window, s.breaker.hold) == ("30%", 300, 300)
    e = s.election
    assert (e.lease_name, e.namespace, e.lease_duration, e.renew_deadline, e.retry_period) == (
        "healthd-controller", "healthd-system", 15, 10, 2)


def test_parsed_from_yaml_shapes() -> None:
    s = ControllerSettings.model_validate({
        "slack_queues": ["a", "b", "a"], "unavailable_verdicts": ["EVICT"],
        "capacity_source": "allocatable", "resets": {"min_spacing": "90s"},
        "breaker": {"max_unhealthy": 5, "window": "10m", "hold": "1h"},
        "election": {"lease_duration": "30s", "renew_deadline": "20s", "retry_period": "5s"}})
    assert s.slack_queues == ("a", "b")
    assert s.bad_verdicts == {Verdict.EVICT}
    assert s.resets.min_spacing == 90
    assert (s.breaker.max_unhealthy, s.breaker.window, s.breaker.hold) == ("5", 600, 3600)
    assert s.breaker.limit(100) == 5
    assert ControllerSettings().breaker.limit(10) == 3
    assert ControllerSettings().breaker.limit(3) == 1  # the floor, min_allowed


@pytest.mark.parametrize(("raw", "message"), [
    ({"unavailable_verdicts": ["WARN"]}, "WARN cannot make capacity unavailable"),
    ({"unavailable_verdicts": ["BROKEN"]}, "unavailable_verdicts"),
    ({"capacity_source": "status"}, "capacity_source"),
    ({"slack_queues": [""]}, "must not be empty"),
    ({"breaker": {"max_unhealthy": "150%"}}, "at most 100%"),
    ({"breaker": {"max_unhealthy": "many"}}, "count like 5 or a percentage"),
    ({"breaker": {"max_unhealthy": 2.5}}, "count like 5"),
    ({"resets": {"min_spacing": "soon"}}, "duration"),
    ({"resets": {"burst": 0}}, "burst"),
    ({"election": {"lease_duration": "5s"}}, "retry_period < renew_deadline < lease_duration"),
    ({"http_port": 70000}, "http_port"),
    ({"surprise": 1}, "surprise"),
])
def test_errors_name_the_field(raw: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        ControllerSettings.model_validate(raw)


def test_thresholds() -> None:
    assert parse_threshold("30%") == (30, True)
    assert parse_threshold(" 12.5 % ") == (12.5, True)
    assert parse_threshold(4) == (4, False)
    assert parse_threshold("4") == (4, False)
    for bad in (True, None, "-1", "1.5", "x%"):
        with pytest.raises(ValueError):
            parse_threshold(bad)
