"""Reading a coordination.k8s.io Lease: who holds it, until when.

The controller's elector writes Leases (healthd.controller.election); `healthd
status` only reads them, with the same rules.
"""

from __future__ import annotations

from healthd.kube.objects import resource_version_of
from healthd.kube.shapes import Lease, LeaseSpec, part
from healthd.util.times import parse_time


def _spec(lease: Lease) -> LeaseSpec:
    return part(lease.get("spec"))


def holder_of(lease: Lease) -> str:
    return str(_spec(lease).get("holderIdentity") or "")


def is_expired(lease: Lease, now: float) -> bool:
    """A one-look judgement for readers that cannot watch the Lease over time (a
    status report): nobody holds it, or `renewTime + leaseDurationSeconds < now`.
    The elector itself never decides this way (see healthd.controller.election)."""
    spec = _spec(lease)
    if not spec.get("holderIdentity"):
        return True
    renewed = parse_time(spec.get("renewTime")) or parse_time(spec.get("acquireTime"))
    if renewed is None:
        return True  # a Lease nobody can judge is a Lease nobody holds
    return renewed + lease_duration(lease, 0.0) < now


def lease_duration(lease: Lease, default: float) -> float:
    """`leaseDurationSeconds`, or `default` when absent or malformed."""
    value = _spec(lease).get("leaseDurationSeconds")
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        return default
    return float(value)


def record_of(lease: Lease) -> tuple[str, str, str]:
    """What changes on every renew: holder, renewTime and the object's version."""
    return (holder_of(lease), str(_spec(lease).get("renewTime") or ""),
            resource_version_of(lease) or "")
