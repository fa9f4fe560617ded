"""Representative agent states and on-demand answers, built by hand so every optional
part of the published documents shows up: the golden documents in `golden.json` are
what healthd wrote for them before the published state had a schema."""

from __future__ import annotations

from checks.base import Entity, Finding, Severity
from healthd.agent.verdict import CheckState, HealthState, Held, Trigger
from healthd.kube.conventions import Verdict
from healthd.requests import Request

T0 = 1_750_000_000.0
UUID = "GPU-00000003-aaaa-bbbb-cccc-dddddddddddd"


def held(code: str, check: str, entity: str, severity: Severity, **kwargs: object) -> Held:
    fields: dict[str, object] = {"sticky": False, "message": f"{code} on {entity}",
                                 "since": T0 - 600}
    fields.update(kwargs)
    return Held(code, check, entity, severity, **fields)  # type: ignore[arg-type]


def ran(status: Severity, at: float = T0, reason: str = "",
        networks: tuple[str, ...] = ()) -> CheckState:
    return CheckState(status, at, Trigger.PERIODIC, reason, 1.5, networks)


def states() -> dict[str, tuple[HealthState, int | None]]:
    """name -> (state, size limit or None for the default)."""
    evict = HealthState(
        Verdict.EVICT, since=T0 - 300, judged=True,
        held=(held("XID_79", "xid", "gpu3", Severity.EVICT, sticky=True, uuid=UUID,
                   message="XID 79: GPU has fallen off the bus \u2014 \u00e9t\u00e9 \"q\"",
                   clear_requested=True),
              held("REMAP_PENDING", "remapped", "gpu1", Severity.ERR, flaps=2,
                   message="x" * 400),
              held("HW_SLOWDOWN", "power", "gpu2", Severity.WARN)),
        checks={"xid": ran(Severity.EVICT), "remapped": ran(Severity.ERR, T0 - 30),
                "power": ran(Severity.WARN),
                "pvc": ran(Severity.UNKNOWN, reason="no PVC API " * 40),
                "dcgm": ran(Severity.SKIPPED, reason="not installed")},
        check_findings={"power": (Finding("CLOCKS_INFO", Severity.PASS, Entity.gpu(0),
                                          "clocks at 1410 MHz"),),
                        "pvc": (Finding("PVC_UNKNOWN", Severity.UNKNOWN, Entity.node("n1"),
                                        "could not tell"),)},
        testing=frozenset({"dcgm:3", "pciebw"}))
    ping = HealthState(
        Verdict.ERR, since=T0, judged=True,
        held=(held("NETWORK_ISOLATED", "ping", "network/net1", Severity.ERR),
              held("PEER_UNREACHABLE", "ping", "peer/n3", Severity.WARN),
              held("PEER_UNREACHABLE", "ping", "peer/n2", Severity.WARN),
              held("PEER_UNREACHABLE", "ping", "peer/n4@net2", Severity.WARN)),
        checks={"ping": ran(Severity.ERR, networks=("net1", "net2"))})
    crowd = HealthState(
        Verdict.WARN, since=T0, judged=True,
        held=tuple(held("PEER_UNREACHABLE", "ping", f"peer/n{i}", Severity.WARN)
                   for i in range(70)),
        checks={"ping": ran(Severity.WARN)})
    many = HealthState(
        Verdict.EVICT, since=T0, judged=True,
        held=tuple(held(f"XID_{i}", "xid", f"gpu{i % 8}", Severity.EVICT if i < 5 else
                        Severity.ERR, message="detail " * 30) for i in range(60)),
        checks={f"check{i}": ran(Severity.PASS, T0 - i) for i in range(12)})
    return {
        "unjudged": (HealthState(Verdict.PASS, since=T0), None),
        "pass": (HealthState(Verdict.PASS, since=T0, judged=True,
                             checks={"remapped": ran(Severity.PASS)}), None),
        "evict": (evict, None),
        "ping": (ping, None),
        "crowd": (crowd, None),
        "truncated": (many, None),
        "checks-too-long": (many, 400),
    }


def answers() -> dict[str, str]:
    """name -> the last-run answer healthd wrote for it."""
    from healthd.requests import answer

    long = Request("run-1", "remapped," * 60, "run", annotation="healthd.io/run")
    return {
        "accepted": answer(Request("trigger-1", "all", "run"), accepted=True, error="",
                           start=T0, end=T0 + 12.3456, verdict=Verdict.WARN,
                           checks={"remapped": "PASS", "pvc": "UNKNOWN"},
                           reasons={"pvc": "no PVC API \u2014 " * 100}),
        "refused": answer(Request("clear-abc", "yes", "clear", error="must be true"),
                          accepted=False, error="must be true \u00e9" * 80, start=T0,
                          end=T0 - 1, verdict=Verdict.PASS, checks={}),
        "long-request": answer(long, accepted=True, error="", start=T0, end=T0,
                               verdict=Verdict.EVICT, checks={"remapped": "EVICT"}),
    }
