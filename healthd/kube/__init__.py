"""Thin helpers over the official kubernetes client: one request choke point (`Kube`),
our own error types, watch with resume and relist, Events, and backoff.

Nothing outside this package handles `kubernetes` or `aiohttp` exceptions: every
failure arrives as a `healthd.kube.errors.KubeError`.
"""

from healthd.kube.backoff import Backoff, retrying
from healthd.kube.client import Kube
from healthd.kube.errors import Conflict, Forbidden, Gone, Invalid, KubeError, NotFound, Unavailable
from healthd.kube.events import EventRecorder
from healthd.kube.objects import Resource
from healthd.kube.watching import WatchEvent, watch, watch_forever

__all__ = [
    "Backoff",
    "Conflict",
    "EventRecorder",
    "Forbidden",
    "Gone",
    "Invalid",
    "Kube",
    "KubeError",
    "NotFound",
    "Resource",
    "Unavailable",
    "WatchEvent",
    "retrying",
    "watch",
    "watch_forever",
]
