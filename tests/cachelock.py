"""One build at a time per cache folder: parallel test runs (and a build by hand)
wait for the first instead of building the same thing twice."""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def cache_locked(root: Path) -> Iterator[None]:
    """Hold the lock of the cache folder `root` (created if need be)."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
