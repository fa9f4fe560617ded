"""The one writer of the agent's Node: labels, annotations, the condition, transitions.

Every write healthd's agent makes to its Node goes through `NodePublisher`, so the
rules of the published state hold in one place:

- Only the latest desired state is kept (no queue): a newer one replaces it.
- Only what differs from the node as the server last showed it is written, and only
  our own keys: labels and annotations in ONE merge patch on the node (null removes a
  key), the `GPUUnhealthy` condition in ONE strategic merge patch on `nodes/status`
  (conditions merge by type, so no other condition is ever sent). Nothing differs:
  no request at all, so a steady state costs zero writes.
- `lastTransitionTime` moves only when the condition's status changes; there is no
  heartbeat (it would write in a steady state). Per-check times in the `health`
  annotation are kept while a check's status is unchanged, for the same reason.
- Every verdict change the Node displays becomes one Event, sent after the write that
  shows it: from the verdict the Node showed before to the one written. A change
  that was replaced before it could be written is never announced (only the latest
  state is written), nor is a write that shows the verdict the Node already showed.
- A conflict (409) is transient: the node is read again and the write retried at
  once against it, up to `CONFLICT_RETRIES` times, with no Event; only when every
  retry met a conflict does a Warning Event (`NodeWriteConflict`) say so, once per
  streak, before the backoff below.
- A metadata patch the server refuses as too large (422: the Node's annotations
  together past 256 KiB, mostly other owners') is never sent again as it is: it is
  split into the labels alone (the verdict must go out), then each annotation alone;
  an annotation refused on its own is not sent again until its value changes. The
  condition goes out either way.
- Any other API failure keeps the desired state and retries with backoff and jitter; the
  first success writes the latest state. Any write that goes through starts the
  backoff again (the server answers: what is left, such as the condition after the
  labels, is not kept waiting by failures from before). A server that could not be
  reached at all is tried again as soon as the node's watch delivers the node (it
  answers again), not only when the backoff ends. The loop never dies; `in_sync` and
  `last_error` tell /readyz and the metrics where it stands.

The server's answer to each patch is taken as the observed node (no waiting for the
watch), and watch events older than what was observed are not taken as they are: one
that shows our keys as the observed node does is a late copy; one that does not is a
late copy from before our last write, or the Node of a restored or replaced API
server whose resourceVersions started again, so the node is read afresh (one GET)
and what it lacks is written again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import anyio

from healthd.agent.node_view import Announcement, DesiredNode, announcement, desired_from
from healthd.agent.verdict import HealthState
from healthd.kube.backoff import Backoff
from healthd.kube.client import Kube
from healthd.kube.conventions import CONDITION_TYPE, Keys, Reason, Verdict
from healthd.kube.errors import Conflict, KubeError, TooLarge, Unavailable
from healthd.kube.events import EventRecorder
from healthd.kube.objects import NODES, annotations_of, condition_of, labels_of, meta
from healthd.kube.shapes import Node, view
from healthd.kube.watching import older_version
from healthd.published import CheckStatus, Health
from healthd.util.times import rfc3339

__all__ = ["DesiredNode", "NodePublisher", "desired_from"]

log = logging.getLogger(__name__)

MAX_RETRY_AFTER_S = 60.0  # a server's Retry-After is honoured up to this
CONFLICT_RETRIES = 3  # immediate re-read-and-retry rounds after a 409


@dataclass(frozen=True)
class _Observed:
    """The node as the server last showed it: what diffs are computed against."""

    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    condition: Mapping[str, Any] | None
    resource_version: str
    involved: dict[str, Any]  # the reference Events point at

    @classmethod
    def of(cls, node: dict[str, Any]) -> _Observed:
        md = meta(node)
        involved = {"apiVersion": "v1", "kind": "Node",
                    "metadata": {k: md[k] for k in ("name", "uid") if k in md}}
        return cls(
            labels=labels_of(node),
            annotations=annotations_of(node),
            condition=condition_of(view(Node, node), CONDITION_TYPE),
            resource_version=str(md.get("resourceVersion") or ""),
            involved=involved,
        )


def _ours(node: _Observed, keys: Keys) -> tuple[Any, ...]:
    """What of `node` is healthd's: our labels, our annotations, our condition."""
    return ({k: v for k, v in node.labels.items() if keys.owns_label(k)},
            {k: v for k, v in node.annotations.items() if keys.owns_annotation(k)},
            node.condition)


class NodePublisher:
    """Keeps the Node showing the latest desired state, writing only differences."""

    def __init__(
        self,
        kube: Kube,
        node: str,
        keys: Keys,
        events: EventRecorder,
        *,
        backoff: Backoff | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._kube = kube
        self._node = node
        self._keys = keys
        self._events = events
        self._backoff = backoff or Backoff()
        self._clock = clock
        self._desired: DesiredNode | None = None
        self._observed: _Observed | None = None
        self._first_label: str | None = None  # the verdict label as first seen
        self._took = False  # whether the node was ever seen
        self._state: HealthState | None = None  # the state the desired Node shows
        self._shown: HealthState | None = None  # the state our last write showed
        self._gen = 0  # bumped by every change that may need a write
        self._done = 0  # the generation last written successfully
        self._last_error = ""
        self._conflict_reported = False  # a NodeWriteConflict Event went out this streak
        self._refused: dict[str, str] = {}  # annotation -> the value refused as too large
        self._wake: anyio.Event | None = None
        self._progress: anyio.Event | None = None
        self._answers: anyio.Event | None = None  # set when the watch delivers the node

    # -- state for probes and metrics ----------------------------------------------

    @property
    def in_sync(self) -> bool:
        """True when the node shows the latest desired state (and its Events went out)."""
        return self._done == self._gen

    @property
    def last_error(self) -> str:
        """Why the last write attempt failed; "" after a success."""
        return self._last_error

    @property
    def observed(self) -> dict[str, Any] | None:
        """Our labels and annotations as last seen on the server (for diagnostics)."""
        if self._observed is None:
            return None
        return {"labels": dict(self._observed.labels),
                "annotations": dict(self._observed.annotations)}

    # -- inputs ----------------------------------------------------------------------

    def observe(self, node_obj: dict[str, Any]) -> None:
        """The node as the agent's watch delivered it. Older than what is known: ignored.
        Someone changed one of our keys: the loop writes it back."""
        if not isinstance(node_obj, dict):
            return
        seen = _Observed.of(node_obj)
        if self._answers is not None:  # whatever its version, the server answers again
            self._answers.set()
        if self._observed is not None and older_version(seen.resource_version,
                                                 self._observed.resource_version):
            if _ours(seen, self._keys) != _ours(self._observed, self._keys):
                self._observed = None  # which copy is right? the server says, once
                self._poke()
            return
        self._take(seen)
        if self.in_sync and self._desired is not None and self._differs(self._desired):
            self._poke()

    def want(self, desired: DesiredNode, state: HealthState | None) -> None:
        """The latest desired state; replaces any older one and wakes the loop.
        `state`: the health state it shows (None: it shows no verdict)."""
        self._desired = desired
        if state is not None and state.judged:
            self._state = state
        self._poke()

    # -- the loop ----------------------------------------------------------------------

    async def run(self) -> None:
        """Write what differs whenever something changes; retry failures with backoff.
        Runs until cancelled."""
        while True:
            if self.in_sync:
                self._wake = anyio.Event()
                await self._wake.wait()
                continue
            generation = self._gen
            try:
                await self._sync()
            except Exception as exc:  # the writer must outlive any failure
                self._failed(exc)
                await self._back_off(exc)
                continue
            self._backoff.reset()
            self._last_error = ""
            self._done = generation
            self._signal()

    async def _back_off(self, exc: Exception) -> None:
        """Wait before the next try: the backoff's delay, cut short when the server
        could not be reached and the node's watch now delivers the node."""
        delay = _delay(self._backoff, exc)
        if not _unreached(exc):
            await anyio.sleep(delay)
            return
        self._answers = anyio.Event()
        try:
            with anyio.move_on_after(delay):
                await self._answers.wait()
        finally:
            self._answers = None

    async def flush(self, timeout_s: float) -> bool:
        """Wait until the node shows the latest desired state; False on timeout."""
        with anyio.move_on_after(timeout_s):
            while not self.in_sync:
                if self._progress is None:
                    self._progress = anyio.Event()
                await self._progress.wait()
        return self.in_sync

    async def patch_annotations(self, ops: list[dict[str, Any]]) -> dict[str, Any]:
        """A JSON patch on the node (the requests module's test-and-remove). Raises
        `KubeError` (`Invalid` when a `test` failed); the answer becomes the observed
        node."""
        answer = await self._kube.json_patch(NODES, self._node, ops)
        self._wrote(answer)
        return answer

    # -- one synchronisation -------------------------------------------------------------

    async def _sync(self) -> None:
        """Write what differs; a conflict re-reads the node and tries again at once."""
        for attempt in range(CONFLICT_RETRIES + 1):
            try:
                await self._sync_once()
            except Conflict as exc:
                self._observed = None  # diff against the node as it is now
                if attempt == CONFLICT_RETRIES:
                    await self._report_conflict(exc)
                    raise
                continue
            self._conflict_reported = False
            return

    async def _report_conflict(self, exc: Conflict) -> None:
        if self._conflict_reported:
            return
        self._conflict_reported = True
        await self._record(Announcement(
            "Warning", Reason.NODE_WRITE_CONFLICT.value,
            f"every one of {CONFLICT_RETRIES + 1} writes of the node's health state met a "
            f"conflict ({exc.message or exc}); retrying with backoff"))

    async def _sync_once(self) -> None:
        if self._observed is None:
            self._take(_Observed.of(await self._kube.get(NODES, self._node)))
        desired, state = self._desired, self._state
        if desired is not None:
            desired = self._keep_times(desired)
            metadata = self._metadata_patch(desired)
            if metadata:
                await self._write_metadata(metadata)
            cond = self._condition_patch(desired)
            if cond is not None:
                self._wrote(await self._kube.strategic_patch(
                    NODES, self._node, {"status": {"conditions": [cond]}}, subresource="status"))
        await self._announce(state)

    async def _write_metadata(self, metadata: dict[str, Any]) -> None:
        """One merge patch; refused as too large: the labels alone, then each annotation
        alone (never the same patch again), remembering the annotations refused."""
        try:
            await self._patch_metadata(metadata)
        except TooLarge as exc:
            parts = [{"labels": metadata["labels"]}] if metadata.get("labels") else []
            parts += [{"annotations": {k: v}}
                      for k, v in (metadata.get("annotations") or {}).items()]
            if len(parts) == 1:  # nothing smaller to try
                self._refuse(metadata, exc)
                return
            log.warning("the node's labels and annotations were refused as too large (%s): "
                        "writing them one by one", exc, extra={"node": self._node})
            for part in parts:
                try:
                    await self._patch_metadata(part)
                except TooLarge as refused:
                    self._refuse(part, refused)

    async def _patch_metadata(self, metadata: dict[str, Any]) -> None:
        self._wrote(await self._kube.merge_patch(NODES, self._node, {"metadata": metadata}))

    def _refuse(self, part: dict[str, Any], exc: TooLarge) -> None:
        for key, value in (part.get("annotations") or {}).items():
            self._refused[key] = value
            log.warning("annotation %s (%d bytes) refused as too large: not sent again until "
                        "it changes (%s)", key, len(value or ""), exc, extra={"node": self._node})

    def _differs(self, desired: DesiredNode) -> bool:
        desired = self._keep_times(desired)
        return bool(self._metadata_patch(desired)) or self._condition_patch(desired) is not None

    def _metadata_patch(self, desired: DesiredNode) -> dict[str, Any]:
        """Our labels and annotations that differ from the observed node (None removes)."""
        observed = self._observed
        labels = _changes(desired.labels, observed.labels if observed else {},
                          self._keys.owns_label)
        wanted = {k: v for k, v in desired.annotations.items()
                  if v is None or self._refused.get(k) != v}
        annotations = _changes(wanted, observed.annotations if observed else {},
                               self._keys.owns_annotation)
        patch: dict[str, Any] = {}
        if labels:
            patch["labels"] = labels
        if annotations:
            patch["annotations"] = annotations
        return patch

    def _condition_patch(self, desired: DesiredNode) -> dict[str, Any] | None:
        """The condition to send, or None when the observed one already says it.
        lastTransitionTime is kept unless the status changes."""
        want = desired.condition
        if want is None:
            return None
        have = self._observed.condition if self._observed else None
        fields = ("status", "reason", "message")
        if have is not None and all(have.get(f) == want.get(f) for f in fields):
            return None
        now = rfc3339(self._clock())
        kept = have.get("lastTransitionTime") if have is not None else None
        moved = have is None or have.get("status") != want.get("status")
        transition = now if moved or not kept else kept
        return {**want, "type": CONDITION_TYPE, "lastTransitionTime": transition,
                "lastHeartbeatTime": now}

    def _keep_times(self, desired: DesiredNode) -> DesiredNode:
        """Keep the times the node already shows for what has not changed (the verdict's
        since, each holding's since, each check's time while its status and reason
        hold), so a periodic run or a restart that changes nothing writes nothing."""
        key = self._keys.health
        new_text = desired.annotations.get(key)
        old_text = self._observed.annotations.get(key) if self._observed else None
        if not new_text or not old_text:
            return desired
        new, old = Health.decode(new_text), Health.decode(old_text)
        if not isinstance(new, Health) or not isinstance(old, Health):
            return desired  # someone wrote garbage there: ours replaces it
        text = _carry_times(new, old).encode()
        if len(text) != len(new_text):  # never let a foreign value grow ours past its bound
            return desired
        return DesiredNode(desired.labels, {**desired.annotations, key: text}, desired.condition)

    # -- Events ------------------------------------------------------------------------

    async def _announce(self, state: HealthState | None) -> None:
        """The Event for the change the node now shows (`state`, just written), from
        what it showed before: our last written state, else the label as first seen."""
        if state is None or state is self._shown:
            return
        before = self._shown
        old = before.verdict if before is not None else (
            _verdict(self._first_label) or Verdict.PASS)
        self._shown = state
        event = announcement(old, state, before)
        if event is not None:
            await self._record(event)

    async def _record(self, event: Announcement) -> None:
        involved = self._observed.involved if self._observed else {
            "apiVersion": "v1", "kind": "Node", "metadata": {"name": self._node}}
        await self._events.record(involved, type=event.type, reason=event.reason,
                                  message=event.message)

    # -- bookkeeping -------------------------------------------------------------------

    def _wrote(self, answer: dict[str, Any]) -> None:
        """A write went through: its answer is the node now, and the server answers."""
        self._take(_Observed.of(answer))
        self._backoff.reset()

    def _take(self, seen: _Observed) -> None:
        if not self._took:  # the label before any write of ours (a re-read is not)
            self._took = True
            self._first_label = seen.labels.get(self._keys.gpuhealth)
        self._observed = seen

    def _poke(self) -> None:
        self._gen += 1
        if self._wake is not None:
            self._wake.set()

    def _signal(self) -> None:
        if self._progress is not None:
            self._progress.set()
            self._progress = None

    def _failed(self, exc: Exception) -> None:
        if isinstance(exc, KubeError):
            self._last_error = str(exc)
            if exc.status == 404:
                self._observed = None  # the node may come back: read it again
        else:
            self._last_error = f"{type(exc).__name__}: {exc}"
            log.exception("node publisher: unexpected failure", extra={"node": self._node})
        log.warning("cannot publish node state: %s", self._last_error,
                    extra={"node": self._node})
        self._signal()


def _unreached(exc: Exception) -> bool:
    """The server could not be reached (no answer at all, not a refusal)."""
    return isinstance(exc, Unavailable) and exc.status is None


def _delay(backoff: Backoff, exc: Exception) -> float:
    """The next backoff, stretched to the server's Retry-After when it sent one."""
    hint = exc.retry_after if isinstance(exc, Unavailable) else None
    return max(backoff.next(), min(hint or 0.0, MAX_RETRY_AFTER_S))


def _changes(desired: Mapping[str, str | None], observed: Mapping[str, str],
             ours: Callable[[str], bool]) -> dict[str, str | None]:
    """The entries of `desired` the observed mapping does not already show; keys we
    do not own are never sent."""
    out: dict[str, str | None] = {}
    for key, value in desired.items():
        if not ours(key):
            log.error("refusing to write %r: not one of healthd's keys", key)
        elif value is None and key in observed:
            out[key] = None
        elif value is not None and observed.get(key) != value:
            out[key] = value
    return out


def _carry_times(new: Health, old: Health) -> Health:
    """`new` with the times `old` shows for its unchanged parts."""
    since = old.since if new.verdict == old.verdict and old.since else new.since
    held_since = {h.key: h.since for h in old.held if h.since}
    held = tuple(replace(h, since=held_since.get(h.key, h.since)) for h in new.held)
    checks = {name: _kept_at(entry, old.checks.get(name)) for name, entry in new.checks.items()}
    return replace(new, since=since, held=held, checks=checks)


def _kept_at(entry: CheckStatus, before: CheckStatus | None) -> CheckStatus:
    """A check's entry with the time it was first seen saying the same."""
    if before is None or not before.at or (before.status, before.reason) != (
            entry.status, entry.reason):
        return entry
    return replace(entry, at=before.at)


def _verdict(value: str | None) -> Verdict | None:
    try:
        return Verdict(value) if value else None
    except ValueError:
        return None
