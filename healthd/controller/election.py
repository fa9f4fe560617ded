"""Leader election on a `coordination.k8s.io/v1` Lease: of several controller
replicas, exactly one acts.

The protocol is client-go's, over `healthd.kube` (get, create, replace with the
resourceVersion read, so two candidates racing for the same Lease get one success
and one `Conflict`):

- a candidate takes the Lease when it is absent, released (empty holder) or expired,
  trying every `retry_s`. Expired means the holder has not renewed it for
  `leaseDurationSeconds` as the candidate observed it on its own monotonic clock
  (the record stopped changing), not `renewTime` compared with the candidate's wall
  clock: a leader whose clock runs behind must not look dead to the others;
- the leader renews every `retry_s`, each try cut short after `renew_s / 2` and
  retried at once over a fresh connection (a silent connection must not use up the
  deadline); when no renew has succeeded for `renew_s`
  (shorter than the lease), counted from when the last good renew was *sent*, it
  stops acting at once: the leader work is cancelled before any standby can have
  seen the Lease unchanged for a whole lease, so two replicas never act together;
- a Lease taken by someone else ends the leadership at the next renew;
- on a clean stop the leader releases the Lease (empty holder, duration 1 s), so a
  standby takes over within one retry period instead of a whole lease;
- a renewal refused as a conflict whose Lease reads back with a resourceVersion
  older than the one the leader last wrote means the server's history moved back
  (etcd restored from a backup): only the leader writes the Lease, so nothing else
  can make it older. The elector tells the shared `Rewinds` (once: not when
  someone noticed since its last write), and the term's caches relist.

Nothing a restart needs is kept here: the controller decides everything from the
cluster's objects, so a new leader simply starts from its caches.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import anyio

from healthd.kube.client import Kube
from healthd.kube.errors import Conflict, KubeError, NotFound
from healthd.kube.leases import holder_of, lease_duration, record_of
from healthd.kube.objects import LEASES, meta, resource_version_of
from healthd.kube.shapes import Lease, part, view
from healthd.kube.watching import Rewinds, older_version
from healthd.util.times import rfc3339

log = logging.getLogger(__name__)

RELEASE_TIMEOUT_S = 2.0  # a clean stop waits this long at most to hand the Lease over


class LostLease(Exception):
    """The Lease is held by someone else now."""


class LeaseElector:
    """Campaigns for the Lease `namespace/name` as `identity`; see the module docstring.

    `clock` gives the wall time written to and compared with the Lease (injected
    in tests); renew deadlines use the monotonic clock. `rewinds` hears when the
    Lease shows the server's history moved back.
    """

    def __init__(self, kube: Kube, *, name: str, namespace: str, identity: str,
                 lease_s: float = 15, renew_s: float = 10, retry_s: float = 2,
                 clock: Callable[[], datetime] | None = None,
                 rewinds: Rewinds | None = None) -> None:
        if not 0 < retry_s < renew_s < lease_s:
            raise ValueError("leader election needs 0 < retry_s < renew_s < lease_s")
        self._kube = kube
        self.name = name
        self.namespace = namespace
        self.identity = identity
        self.lease_s = lease_s
        self.renew_s = renew_s
        self.retry_s = retry_s
        self._clock = clock or (lambda: datetime.now(UTC))
        self._lease: Lease | None = None  # the latest version we wrote or read
        self._seen: tuple[str, str, str] | None = None  # the Lease record last observed
        self._seen_at = 0.0  # monotonic time it was first observed
        self._sent_at = 0.0  # monotonic time our last successful write was sent
        self._rewinds = rewinds or Rewinds()
        self._written: str | None = None  # the version our last write got
        self._written_at = 0  # the rewinds' count then
        self.is_leader = False

    # -- the loop ------------------------------------------------------------------

    async def run(self, on_lead: Callable[[], Awaitable[None]]) -> None:
        """Campaign; run `on_lead()` while leader, cancel it when leadership is lost,
        campaign again. Returns when `on_lead` returns by itself; releases the Lease
        whenever it stops leading cleanly (return or cancellation)."""
        try:
            while True:
                await self._acquire()
                if not await self._lead(on_lead):
                    return
                log.warning("%s: lost the Lease %s/%s; campaigning again",
                            self.identity, self.namespace, self.name)
        finally:
            if self.is_leader:
                self.is_leader = False
                with anyio.CancelScope(shield=True), anyio.move_on_after(RELEASE_TIMEOUT_S):
                    await self._release()

    async def _acquire(self) -> None:
        """Return once this candidate holds the Lease."""
        while True:
            try:
                if await self._try_acquire():
                    self.is_leader = True
                    log.info("%s: leading (Lease %s/%s)", self.identity, self.namespace,
                             self.name)
                    return
            except KubeError as exc:
                log.info("%s: cannot take the Lease yet: %s", self.identity, exc)
            await anyio.sleep(self.retry_s)

    async def _lead(self, on_lead: Callable[[], Awaitable[None]]) -> bool:
        """Run `on_lead` while renewing. True: leadership was lost; False: `on_lead`
        returned."""
        lost = False
        async with anyio.create_task_group() as group:

            async def work() -> None:
                await on_lead()
                group.cancel_scope.cancel()

            async def keep() -> None:
                nonlocal lost
                await self._keep_renewing()
                lost = True
                self.is_leader = False
                group.cancel_scope.cancel()  # stop acting before any standby may act

            group.start_soon(keep)
            group.start_soon(work)
        return lost

    async def _keep_renewing(self) -> None:
        """Renew every retry period; return when leadership is lost.

        One try waits at most half the renew deadline (client-go's leader clients do
        the same): a try stuck on a connection gone silent is cut short and the next
        goes out at once over a fresh connection, while the deadline still leaves
        time for it, instead of letting the deadline pass and taking the Lease back."""
        retry_now = False
        while True:
            if not retry_now:
                await anyio.sleep(self.retry_s)
            retry_now = False
            left = self.renew_s - (anyio.current_time() - self._sent_at)
            if left <= 0:
                log.error("%s: could not renew the Lease for %.1f s; stopping work",
                          self.identity, self.renew_s)
                return
            try:
                with anyio.fail_after(min(left, self.renew_s / 2)):
                    await self._renew()
            except LostLease as exc:
                log.error("%s: %s", self.identity, exc)
                return
            except TimeoutError:
                log.warning("%s: renewing the Lease got no answer; trying again over a "
                            "fresh connection", self.identity)
                await self._kube.drop_connections()
                retry_now = True
            except KubeError as exc:
                log.warning("%s: renewing the Lease failed: %s", self.identity, exc)

    # -- one step each -------------------------------------------------------------

    async def _try_acquire(self) -> bool:
        try:
            lease = await self._read()
        except NotFound:
            sent = anyio.current_time()
            self._lease = self._wrote(await self._kube.create(LEASES, self._new_lease(),
                                                              self.namespace))
            self._sent_at = sent
            return True
        holder = holder_of(lease)
        if holder != self.identity and not self._expired(lease):
            self._lease = lease
            return False
        self._lease = await self._write(lease, self._clock(), taking=holder != self.identity)
        return True

    def _expired(self, lease: Lease) -> bool:
        """Nobody holds `lease`, or its record has not changed for a lease duration
        as this candidate observed it."""
        if not holder_of(lease):
            return True
        now = anyio.current_time()
        if record_of(lease) != self._seen:
            self._seen, self._seen_at = record_of(lease), now
        return now - self._seen_at > lease_duration(lease, self.lease_s)

    async def _renew(self) -> None:
        lease = self._lease or await self._read()
        try:
            self._lease = await self._write_held(lease)
        except Conflict:
            # Our copy is stale: someone wrote the Lease, or the server lost what we
            # wrote. Still ours? Renew that version.
            lease = await self._read()
            self._check_history(lease)
            self._lease = await self._write_held(lease)

    def _check_history(self, lease: Lease) -> None:
        """Tell the rewinds when `lease` is older than our last write, unless the
        history moving back was noticed since that write."""
        version = resource_version_of(lease)
        if older_version(version, self._written) and self._rewinds.count == self._written_at:
            self._rewinds.notice(f"the Lease {self.namespace}/{self.name} is at version "
                                 f"{version}; {self.identity} wrote version {self._written}")

    async def _write_held(self, lease: Lease) -> Lease:
        if holder_of(lease) != self.identity:
            raise LostLease(f"the Lease is now held by {holder_of(lease) or 'nobody'}")
        return await self._write(lease, self._clock(), taking=False)

    async def _release(self) -> None:
        """Hand the Lease over: empty holder, expired at once. Best effort."""
        try:
            lease = await self._read()
            if holder_of(lease) != self.identity:
                return
            body = _with_spec(lease, holderIdentity="", leaseDurationSeconds=1,
                              renewTime=rfc3339(self._clock().timestamp(), digits=6))
            await self._kube.replace(LEASES, self.name, body, self.namespace)
            log.info("%s: released the Lease %s/%s", self.identity, self.namespace, self.name)
        except KubeError as exc:
            log.warning("%s: could not release the Lease (it expires by itself): %s",
                        self.identity, exc)

    async def _read(self) -> Lease:
        return view(Lease, await self._kube.get(LEASES, self.name, self.namespace))

    async def _write(self, lease: Lease, now: datetime, *, taking: bool) -> Lease:
        """PUT the Lease held by us, conditional on the version read (else Conflict)."""
        if resource_version_of(lease) is None:
            raise KubeError("the Lease read has no resourceVersion", reason="BadResponse")
        stamp = rfc3339(now.timestamp(), digits=6)
        changes: dict[str, Any] = {"holderIdentity": self.identity, "renewTime": stamp,
                                   "leaseDurationSeconds": self._duration}
        if taking:
            transitions = part(lease.get("spec")).get("leaseTransitions")
            count = transitions if isinstance(transitions, int) else 0
            changes |= {"acquireTime": stamp, "leaseTransitions": count + 1}
        body = _with_spec(lease, **changes)
        sent = anyio.current_time()
        written = await self._kube.replace(LEASES, self.name, body, self.namespace)
        self._sent_at = sent
        return self._wrote(written)

    def _wrote(self, answer: dict[str, Any]) -> Lease:
        """The Lease our write got back, remembered as the latest we wrote."""
        lease = view(Lease, answer)
        self._written, self._written_at = resource_version_of(lease), self._rewinds.count
        return lease

    def _new_lease(self) -> dict[str, Any]:
        stamp = rfc3339(self._clock().timestamp(), digits=6)
        return {
            "apiVersion": LEASES.api_version, "kind": LEASES.kind,
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {"holderIdentity": self.identity, "leaseDurationSeconds": self._duration,
                     "acquireTime": stamp, "renewTime": stamp, "leaseTransitions": 0},
        }

    @property
    def _duration(self) -> int:
        # The field is whole seconds; round up so the Lease never claims less than us.
        return max(1, math.ceil(self.lease_s))


def _with_spec(lease: Lease, **fields: Any) -> dict[str, Any]:
    """A copy of `lease` (metadata with its resourceVersion kept) with spec fields set."""
    return {"apiVersion": LEASES.api_version, "kind": LEASES.kind,
            "metadata": meta(lease), "spec": {**part(lease.get("spec")), **fields}}
