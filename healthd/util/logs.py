"""Structured logs: one JSON object per line, with the node, check and request id.

Log aggregators (Loki, Elasticsearch) index fields, not prose, so every record the
agent writes carries `node` (set once by `configure_logging`), and `check` and
`request_id` when the code that logs runs inside `log_context(...)`: the runner sets
the check, the request handler sets the request id. Context variables follow the
task, so concurrent runs never mix their fields. Extras passed with
`log.info("...", extra={"verdict": "ERR"})` become fields too.
"""

from __future__ import annotations

import argparse
import contextvars
import json
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from healthd.util.times import rfc3339

_check: contextvars.ContextVar[str] = contextvars.ContextVar("healthd_check", default="")
_request: contextvars.ContextVar[str] = contextvars.ContextVar("healthd_request", default="")

# Attributes every LogRecord has; anything else on a record came from `extra=`.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


@contextmanager
def log_context(*, check: str | None = None, request_id: str | None = None) -> Iterator[None]:
    """Tag every record logged inside the block (in this task) with a check and/or a
    request id."""
    tokens: list[tuple[contextvars.ContextVar[str], contextvars.Token[str]]] = []
    if check is not None:
        tokens.append((_check, _check.set(check)))
    if request_id is not None:
        tokens.append((_request, _request.set(request_id)))
    try:
        yield
    finally:
        for var, token in reversed(tokens):
            var.reset(token)


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON line: time, level, logger, message, node, check,
    request_id, then any extras; an exception goes in `error`."""

    def __init__(self, node: str = "") -> None:
        super().__init__()
        self.node = node

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": rfc3339(record.created, digits=3),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "node": self.node,
            "check": _check.get(),
            "request_id": _request.get(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in out:
                out[key] = value
        if record.exc_info:
            out["error"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, separators=(",", ":"))


def configure_logging(level: str | int = "INFO", node: str = "",
                      stream: TextIO | None = None) -> logging.Handler:
    """Send every log record (root logger) to `stream` (stderr) as JSON lines; returns
    the handler so a caller can remove it."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter(node))
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h.formatter, JsonFormatter)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    # The HTTP access log and the scheduler's per-run lines would drown the agent's own.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
    return handler


def add_log_level_argument(parser: argparse.ArgumentParser) -> None:
    """`--log-level`, as the daemons spell it."""
    parser.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING"))
