"""Structured logs: one JSON object per line with time, level, logger, message, the
node, and the check and request id of the task that logged, plus extras."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from healthd.util.logs import configure_logging, log_context


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    handler = configure_logging("INFO", "gpu-node-7", stream)
    yield stream
    logging.getLogger().removeHandler(handler)


def lines(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_records_carry_node_check_request_and_extras(captured: io.StringIO) -> None:
    log = logging.getLogger("healthd.test")
    with log_context(request_id="req-9"), log_context(check="remapped"):
        log.warning("verdict %s", "ERR", extra={"verdict": "ERR"})
    log.info("outside")
    inside, outside = lines(captured)
    assert inside["message"] == "verdict ERR" and inside["level"] == "WARNING"
    assert (inside["node"], inside["check"], inside["request_id"]) == (
        "gpu-node-7", "remapped", "req-9")
    assert inside["verdict"] == "ERR" and inside["time"].endswith("Z")
    assert (outside["check"], outside["request_id"]) == ("", "")


def test_exceptions_and_odd_values_still_make_one_json_line(captured: io.StringIO) -> None:
    log = logging.getLogger("healthd.test")
    try:
        raise RuntimeError("nvml exploded\nsecond line")
    except RuntimeError:
        log.exception("check failed", extra={"obj": object()})
    (record,) = lines(captured)
    assert "nvml exploded" in record["error"] and record["level"] == "ERROR"
