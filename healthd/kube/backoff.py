"""Backoff with jitter: how long to wait before trying the API server again.

Every retry loop in healthd (the node publisher, watches, leader election) waits
through a `Backoff`, so a fleet of agents that lost the server together does not
come back in lock-step. `retrying` wraps one call in that loop.

Usage::

    backoff = Backoff(initial=0.5, maximum=30)
    while True:
        try:
            await write()
            backoff.reset()
            break
        except Unavailable:
            await anyio.sleep(backoff.next())
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio

from healthd.kube.errors import Unavailable

log = logging.getLogger(__name__)

T = TypeVar("T")


class Backoff:
    """Exponential delays: `initial`, then times `factor` per failure, up to `maximum`.

    Jitter is proportional by default (each delay is scaled by a random factor in
    [1 - jitter, 1 + jitter], then capped at `maximum`); `full=True` draws each delay
    uniformly from [0, delay] instead ("full jitter"). `rng` makes it reproducible.
    """

    def __init__(self, initial: float = 0.5, maximum: float = 30, factor: float = 2,
                 jitter: float = 0.2, *, full: bool = False,
                 rng: random.Random | None = None) -> None:
        if initial <= 0 or maximum < initial or factor < 1 or not 0 <= jitter <= 1:
            raise ValueError("backoff needs 0 < initial <= maximum, factor >= 1, "
                             "0 <= jitter <= 1")
        self.initial = initial
        self.maximum = maximum
        self.factor = factor
        self.jitter = jitter
        self.full = full
        self._rng = rng or random.Random()
        self.failures = 0

    def next(self) -> float:
        """The delay to wait now (seconds); each call counts one more failure."""
        base = min(self.maximum, self.initial * self.factor ** min(self.failures, 64))
        self.failures += 1
        if self.full:
            return self._rng.uniform(0, base)
        spread = base * self.jitter
        return min(self.maximum, max(0.0, base + self._rng.uniform(-spread, spread)))

    def reset(self) -> None:
        """Back to `initial` after a success."""
        self.failures = 0


async def retrying(fn: Callable[[], Awaitable[T]], *, backoff: Backoff | None = None,
                   retry_on: tuple[type[BaseException], ...] = (Unavailable,),
                   attempts: int | None = None) -> T:
    """`await fn()` until it succeeds, waiting through `backoff` after each failure
    in `retry_on` (a server's Retry-After hint is honoured when longer). After
    `attempts` tries (None: forever) the last error is raised."""
    backoff = backoff or Backoff()
    tried = 0
    while True:
        try:
            result = await fn()
        except retry_on as exc:
            tried += 1
            if attempts is not None and tried >= attempts:
                raise
            delay = max(backoff.next(), getattr(exc, "retry_after", None) or 0.0)
            log.debug("retrying in %.2f s after: %s", delay, exc)
            await anyio.sleep(delay)
            continue
        backoff.reset()
        return result
