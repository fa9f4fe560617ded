"""Safety rails on AppWrapper resets: a global rate limit, a minimum spacing per
AppWrapper, and a circuit breaker on mass node failures.

A reset throws away running work, so the controller never trusts one signal
blindly. The token bucket bounds how many resets happen per unit of time; the
spacing keeps a flapping node label from resetting the same AppWrapper again and
again (it also reads the AppWrapper's own `Unhealthy` condition, so a restarted
controller respects it without any memory); the breaker stops resets when so
many GPU nodes turn bad together that the health signal itself is suspect.

Everything here is pure: time comes from an injected clock (seconds since the
epoch, because spacing compares with timestamps written into objects), and no
object does I/O.
"""

from __future__ import annotations

import enum
import time
from collections import deque
from collections.abc import Callable

from healthd.config.controller import parse_threshold, tolerated_bad_nodes

Clock = Callable[[], float]


class TokenBucket:
    """`burst` tokens, refilled at `rate_per_s`; each reset takes one.

    >>> bucket = TokenBucket(1.0, 2, clock=lambda: 0.0)
    >>> bucket.take(), bucket.take(), bucket.take()
    (True, True, False)
    """

    def __init__(self, rate_per_s: float, burst: int, clock: Clock = time.time) -> None:
        if rate_per_s <= 0 or burst < 1:
            raise ValueError("a token bucket needs rate_per_s > 0 and burst >= 1")
        self.rate_per_s = rate_per_s
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._at = clock()

    def _refill(self) -> None:
        now = self._clock()
        # max(): a clock that steps back must not drain the bucket.
        self._tokens = min(self.burst, self._tokens + max(0.0, now - self._at) * self.rate_per_s)
        self._at = now

    @property
    def tokens(self) -> float:
        self._refill()
        return self._tokens

    def take(self) -> bool:
        """Take one token; False (and nothing taken) when the bucket is empty."""
        self._refill()
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True

    def give_back(self) -> None:
        """Return a token taken for a reset that was not written after all."""
        self._tokens = min(self.burst, self._tokens + 1)

    def wait_s(self) -> float:
        """Seconds until the next token is there (0 when one is)."""
        self._refill()
        return max(0.0, (1 - self._tokens) / self.rate_per_s)


class Spacing:
    """At least `min_s` seconds between two resets of one AppWrapper.

    The last reset comes from this process's memory and from the object itself
    (the `Unhealthy` condition's lastTransitionTime, when it was set by a reset);
    the later of the two counts.
    """

    def __init__(self, min_s: float, clock: Clock = time.time) -> None:
        if min_s < 0:
            raise ValueError("min spacing must be >= 0")
        self.min_s = min_s
        self._clock = clock
        self._last: dict[str, float] = {}

    def remaining_s(self, key: str, last_from_object: float | None = None) -> float:
        """Seconds before `key` may be reset again (0: now)."""
        last = max(self._last.get(key, float("-inf")),
                   float("-inf") if last_from_object is None else last_from_object)
        return max(0.0, last + self.min_s - self._clock())

    def allowed(self, key: str, last_from_object: float | None = None) -> bool:
        return self.remaining_s(key, last_from_object) <= 0

    def record(self, key: str) -> None:
        """`key` was reset (or would have been, in a dry run) now."""
        self._last.pop(key, None)  # re-inserted last: the dict stays in time order
        self._last[key] = self._clock()
        self._forget_old()

    def forget(self) -> None:
        """Forget every reset this process remembers: they were written into a
        history the server no longer has (etcd restored from a backup), where the
        AppWrappers' own conditions are the only record left."""
        self._last.clear()

    def _forget_old(self) -> None:
        # Keep memory bounded on clusters that churn through many AppWrappers. The
        # oldest entries come first, so this stops at the first one still needed:
        # a burst of resets costs O(1) each, not a scan of every one remembered.
        horizon = self._clock() - self.min_s
        while self._last:
            oldest = next(iter(self._last))
            if self._last[oldest] >= horizon:
                return
            del self._last[oldest]


class BreakerState(enum.StrEnum):
    CLOSED = "closed"  # resets flow
    OPEN = "open"  # resets stop


class Breaker:
    """Opens when more than `max_unhealthy` GPU nodes turned bad within `window_s`;
    closes once the count of bad nodes has stayed at or under that threshold for
    `hold_s`.

    `max_unhealthy` is a share of the GPU nodes (`"30%"`) or a count (`"5"`);
    "more than" is strict. `min_allowed` is a floor under it in nodes, the larger
    wins: 30% of 3 nodes is 0.9, so without the floor one bad node of three would
    stop every reset on a small cluster. "Turned bad within the window" is the rise of the bad
    count over the lowest count seen in the window; before any history (a fresh
    start) the baseline is 0, so a controller started in the middle of a mass
    failure does not reset everything the previous one held back. A slow rise
    over longer than the window is real failure and does not trip the breaker.

    Feed it with `update(bad_nodes, gpu_nodes)` on every change of the fleet; the
    `open` property also closes it by itself once the hold time has passed, and
    `next_change_s()` tells a caller when to look again.
    """

    def __init__(self, max_unhealthy: str, window_s: float, hold_s: float,
                 clock: Clock = time.time, *, min_allowed: int = 0) -> None:
        parse_threshold(max_unhealthy)  # a bad threshold fails here, not at the first update
        if window_s <= 0 or hold_s < 0:
            raise ValueError("breaker window must be > 0 and hold >= 0")
        if min_allowed < 0:
            raise ValueError("breaker min_allowed must be >= 0")
        self.max_unhealthy = max_unhealthy
        self.min_allowed = min_allowed
        self.window_s = window_s
        self.hold_s = hold_s
        self._clock = clock
        self._samples: deque[tuple[float, int]] = deque()  # (time, bad nodes)
        self._state = BreakerState.CLOSED
        self._under_since: float | None = None  # open, and under the threshold since
        self.bad_nodes = 0
        self.gpu_nodes = 0

    def limit(self, gpu_nodes: int) -> float:
        """The most bad nodes tolerated among `gpu_nodes`: the threshold or the floor,
        whichever is larger."""
        return tolerated_bad_nodes(self.max_unhealthy, self.min_allowed, gpu_nodes)

    def update(self, bad_nodes: int, gpu_nodes: int) -> BreakerState:
        """Record the fleet now; returns the state after it."""
        now = self._clock()
        bad_nodes, gpu_nodes = max(0, bad_nodes), max(0, gpu_nodes)
        # Keep the last sample from before the window: the count when the window began.
        while len(self._samples) > 1 and self._samples[1][0] <= now - self.window_s:
            self._samples.popleft()
        baseline = min((b for _, b in self._samples), default=0)
        self._samples.append((now, bad_nodes))
        self.bad_nodes, self.gpu_nodes = bad_nodes, gpu_nodes
        limit = self.limit(gpu_nodes)
        if self._state is BreakerState.CLOSED:
            if gpu_nodes and bad_nodes - baseline > limit:
                self._state, self._under_since = BreakerState.OPEN, None
        elif bad_nodes > limit:
            self._under_since = None
        elif self._under_since is None:
            self._under_since = now
        self._close_if_held(now)
        return self._state

    def _close_if_held(self, now: float) -> None:
        if (self._state is BreakerState.OPEN and self._under_since is not None
                and now - self._under_since >= self.hold_s):
            self._state, self._under_since = BreakerState.CLOSED, None

    @property
    def state(self) -> BreakerState:
        self._close_if_held(self._clock())
        return self._state

    @property
    def open(self) -> bool:
        return self.state is BreakerState.OPEN

    def next_change_s(self) -> float | None:
        """Seconds until the breaker closes by itself, or None when nothing is pending."""
        if self.state is not BreakerState.OPEN or self._under_since is None:
            return None
        return max(0.0, self._under_since + self.hold_s - self._clock())

    def describe(self) -> str:
        """One line for logs and Events."""
        return (f"{self.bad_nodes} of {self.gpu_nodes} GPU nodes bad "
                f"(threshold: more than {self.max_unhealthy}, at least {self.min_allowed} "
                f"tolerated, within {self.window_s:g} s)")
