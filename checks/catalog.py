"""The one catalog of finding codes: default severity, stickiness, meaning.

Every code a check can report is listed here (or belongs to a family: `XID_<n>`,
`DCGM_<TEST>`). The config overrides severity and stickiness per code through
`Catalog(overrides)`; nothing else decides what a code means.

Sticky codes clear only through `healthd.io/clear` followed by a passing run.

Each code also says how much evidence raises it (`RaiseRule`): a steady signal
(a counter, a clock reason, a link state) waits for a second sighting so that one
noisy reading never moves the label; an event or a long diagnostic, which is not
seen again on the next run, raises on its first sighting.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

from checks.severity import Severity

S = Severity


@dataclass(frozen=True)
class RaiseRule:
    """A non-fatal finding is raised once it was seen in `seen` of the last `runs`
    completed runs of its check (or in two consecutive ones). `seen` 1: at once."""

    seen: int = 2
    runs: int = 3

    def __post_init__(self) -> None:
        if not 1 <= self.seen <= self.runs:
            raise ValueError(f"raise rule needs 1 <= seen <= runs, got {self.seen} of {self.runs}")


STEADY = RaiseRule()  # signals read again on every run
AT_ONCE = RaiseRule(1, 1)  # events and diagnostics: the next run will not see them again


@dataclass(frozen=True)
class CodeSpec:
    code: str
    severity: Severity
    sticky: bool
    description: str
    raise_rule: RaiseRule = STEADY


def _spec(code: str, severity: Severity, description: str, sticky: bool = False,
          raise_rule: RaiseRule = STEADY) -> CodeSpec:
    return CodeSpec(code, severity, sticky, description, raise_rule)


DEFAULT_CODES: dict[str, CodeSpec] = {
    s.code: s
    for s in (
        # A definitive hardware state (the driver's own flag, not a noisy reading):
        # damping it would only add a poll interval to fault-to-label.
        _spec("REMAP_PENDING", S.ERR, "row remapping pending: the GPU needs a reset",
              raise_rule=AT_ONCE),
        _spec("REMAP_FAILURE", S.EVICT, "row remapping failed: the GPU needs service", True),
        # The driver's own recovery action (NVML field 230): a definitive flag, raised
        # at once; why each has its severity: docs/checks.md.
        _spec("RECOVERY_GPU_RESET", S.ERR, "the driver asks for a GPU reset",
              raise_rule=AT_ONCE),
        _spec("RECOVERY_BUS_RESET", S.ERR, "the driver asks for a reset of the GPU's PCIe bus",
              raise_rule=AT_ONCE),
        _spec("RECOVERY_DRAIN_P2P", S.EVICT,
              "the driver asks to end every process using the GPU's peer-to-peer traffic"),
        _spec("RECOVERY_DRAIN_AND_RESET", S.EVICT,
              "the driver asks to drain peer-to-peer traffic and reset the GPU", True),
        _spec("RECOVERY_NODE_REBOOT", S.EVICT, "the driver asks for a node reboot", True),
        _spec("RECOVERY_SYSTEM_REBOOT", S.EVICT, "the driver asks for a system reboot", True),
        _spec("RECOVERY_IMEX_DOMAIN", S.ERR,
              "the driver asks to recover the GPU's IMEX (multi-node NVLink) domain",
              raise_rule=AT_ONCE),
        _spec("RECOVERY_UNKNOWN_ACTION", S.WARN,
              "the driver asks for a recovery action newer than healthd knows",
              raise_rule=AT_ONCE),
        _spec("HW_SLOWDOWN", S.WARN, "hardware slowdown, power brake or thermal slowdown"),
        _spec("PCIE_LINK_DEGRADED", S.WARN, "PCIe link below its maximum generation or width"),
        _spec("PCIE_REPLAYS", S.WARN, "PCIe replay counter rising"),
        _spec("PCIE_BW_LOW", S.WARN, "PCIe bandwidth below the link's expected rate"),
        # PCIe AER counters that grew since the last run: growth is an event, not seen
        # again on the next run, so the uncorrectable ones are raised at once; why each
        # has its severity: docs/checks.md.
        _spec("PCIE_AER_FATAL", S.EVICT,
              "a fatal PCIe error on the GPU or a bridge above it (AER)", True),
        _spec("PCIE_AER_NONFATAL", S.ERR,
              "an uncorrectable non-fatal PCIe error on the GPU or a bridge above it (AER)",
              raise_rule=AT_ONCE),
        _spec("PCIE_AER_CORRECTABLE", S.WARN,
              "correctable PCIe errors on the GPU's path above the tolerated rate (AER)"),
        _spec("ECC_UNCORRECTED", S.ERR, "volatile uncorrected ECC errors"),
        _spec("PAGES_PENDING", S.ERR, "retired pages pending (needs a reset)"),
        _spec("NVLINK_DOWN", S.ERR, "an NVLink that should be up is down"),
        _spec("FABRIC_NOT_STARTED", S.ERR,
              "the Fabric Manager has not started registering the GPU in the NVLink fabric"),
        _spec("FABRIC_IN_PROGRESS", S.ERR,
              "the GPU's NVLink fabric registration is still in progress past the grace"),
        # The Fabric Manager's final answer, not a reading that may swing: at once.
        _spec("FABRIC_REGISTRATION_FAILED", S.ERR,
              "the Fabric Manager failed to register the GPU in the NVLink fabric",
              raise_rule=AT_ONCE),
        _spec("GPU_MISSING", S.EVICT, "a GPU is lost or fewer GPUs than expected", True),
        _spec("PEER_UNREACHABLE", S.WARN, "a peer node does not answer ping"),
        _spec("NETWORK_ISOLATED", S.ERR, "this node cannot reach most of its peers (on a network)"),
        _spec("NIC_DOWN", S.ERR, "a training network's interface is down or has no carrier"),
        _spec("NIC_DOWN_AUXILIARY", S.WARN, "a non-training secondary interface is down"),
        _spec("NIC_MISSING", S.ERR, "an interface Multus attached is not in the pod"),
        _spec("NIC_FLAPPING", S.WARN, "a secondary interface's carrier went down and up"),
        _spec("NIC_MTU_MISMATCH", S.WARN, "a secondary interface's MTU is not the expected one"),
        _spec("NIC_ERRORS", S.WARN, "a secondary interface's error or drop counters grow"),
        _spec("NIC_SPEED_LOW", S.WARN, "a secondary interface runs below its expected speed"),
        # A down RDMA port breaks every multi-node job now: raised on first sighting.
        CodeSpec("RDMA_PORT_DOWN", S.ERR, False,
                 "an RDMA port (InfiniBand/RoCE) is down or its physical link is not up",
                 AT_ONCE),
        _spec("RDMA_RATE_LOW", S.WARN, "an RDMA port runs below its expected rate"),
        _spec("RDMA_ERRORS", S.WARN, "an RDMA port's error counters grow"),
        _spec("PVC_NOT_BOUND", S.WARN, "a test PVC did not bind in time"),
        _spec("PVC_PROVISION_ERROR", S.WARN, "the provisioner reported an error"),
        _spec("DCGM_ISOLATE", S.EVICT, "DCGM asks to isolate the GPU (exit 205)", True),
        CodeSpec("SXID_FATAL", S.EVICT, True, "an NVSwitch error the driver logged as fatal",
                 AT_ONCE),
    )
}

# XID codes by NVIDIA's published meaning (XID catalog, r580). Application-caused
# XIDs are PASS: reported, never raise the verdict.
_XID_INFO = {13, 31, 32, 43, 45, 68, 69}
_XID_DEFAULT: dict[int, tuple[Severity, bool, str]] = {
    8: (S.ERR, False, "GPU stopped processing"),
    48: (S.ERR, False, "double-bit ECC error"),
    61: (S.WARN, False, "internal micro-controller breakpoint/warning"),
    62: (S.ERR, False, "internal micro-controller halt"),
    63: (S.WARN, False, "ECC page retirement or row remapping recorded"),
    64: (S.ERR, False, "ECC page retirement or row remapping failure"),
    74: (S.ERR, False, "NVLink error"),
    79: (S.EVICT, True, "GPU has fallen off the bus"),
    92: (S.WARN, False, "high single-bit ECC error rate"),
    94: (S.ERR, False, "contained ECC error: affected application must restart"),
    95: (S.EVICT, False, "uncontained ECC error: GPU must be reset"),
    109: (S.ERR, False, "context switch timeout"),
    119: (S.ERR, False, "GSP RPC timeout"),
    120: (S.ERR, False, "GSP error"),
    123: (S.ERR, False, "SPI PMU RPC failure"),
    140: (S.EVICT, False, "unrecovered ECC error"),
    154: (S.EVICT, False, "GPU recovery action changed: reset or reboot required"),
}

# DCGM tests whose failure means the GPU cannot be trusted with work (sticky EVICT).
FATAL_DCGM_TESTS = frozenset({"PCIE", "NVLINK", "MEMORY", "ECC"})

# NVSwitch SXIDs, from NVIDIA's Fabric Manager User Guide (DU-09883-001, appendix
# "NVSwitch SXid Errors": non-fatal, fatal and always-fatal lists). Non-fatal ones are
# corrected single-bit ECC errors the NVSwitch fixes itself: informational (PASS).
# Fatal ones stop NVLink traffic through the port or the whole fabric: running
# multi-GPU work hangs or fails and the board needs a reset of its GPUs and NVSwitches
# (a host restart), so they are a sticky EVICT, cleared by healthd.io/clear after it.
_SXID_NON_FATAL = frozenset({11012, 11021, 11022, 11023, 12021, 12023, 15008, 15011, 19049,
                             19055, 19057, 19059, 19062, 19065, 19068, 19071, 24001, 24002,
                             24003})
_SXID_FATAL = frozenset({20034, 22012, 24004, 24005, 24006, 24007})  # fatal to the port
_SXID_ALWAYS_FATAL = frozenset({12020, 22003, 22011, 23001, 23002, 23003, 23004, 23005})
# An SXID the guide does not list but the driver logs as "Fatal": the same verdict.
SXID_FATAL = "SXID_FATAL"

_XID_RE = re.compile(r"^XID_(\d+)$")
_SXID_RE = re.compile(r"^SXID_(\d+)$")
_DCGM_RE = re.compile(r"^DCGM_([A-Z0-9_]+)$")


def xid_spec(xid: int) -> CodeSpec:
    code = f"XID_{xid}"
    if xid in _XID_INFO:
        return CodeSpec(code, S.PASS, False, "application-caused XID (informational)", AT_ONCE)
    severity, sticky, meaning = _XID_DEFAULT.get(xid, (S.WARN, False, "unlisted XID"))
    return CodeSpec(code, severity, sticky, meaning, AT_ONCE)


def sxid_spec(sxid: int) -> CodeSpec:
    code = f"SXID_{sxid}"
    if sxid in _SXID_ALWAYS_FATAL:
        return CodeSpec(code, S.EVICT, True,
                        "fatal NVSwitch error for the whole fabric: restart the host", AT_ONCE)
    if sxid in _SXID_FATAL:
        return CodeSpec(code, S.EVICT, True,
                        "fatal NVSwitch port error: reset the GPUs and NVSwitches", AT_ONCE)
    if sxid in _SXID_NON_FATAL:
        return CodeSpec(code, S.PASS, False, "corrected NVSwitch error (informational)",
                        AT_ONCE)
    return CodeSpec(code, S.WARN, False, "unlisted non-fatal NVSwitch error", AT_ONCE)


def is_fatal_sxid(sxid: int) -> bool:
    """Whether the catalogue itself calls `sxid` fatal (to a port or the fabric)."""
    return sxid in _SXID_FATAL or sxid in _SXID_ALWAYS_FATAL


def dcgm_spec(test: str) -> CodeSpec:
    code = f"DCGM_{test}"
    if test in FATAL_DCGM_TESTS:
        return CodeSpec(code, S.EVICT, True, f"DCGM diagnostic {test} failed (fatal)", AT_ONCE)
    return CodeSpec(code, S.ERR, False, f"DCGM diagnostic {test} failed", AT_ONCE)


def default_spec(code: str) -> CodeSpec | None:
    """The built-in meaning of a code, including the XID_ and DCGM_ families."""
    if code in DEFAULT_CODES:
        return DEFAULT_CODES[code]
    if m := _XID_RE.match(code):
        return xid_spec(int(m.group(1)))
    if m := _DCGM_RE.match(code):
        return dcgm_spec(m.group(1))
    if m := _SXID_RE.match(code):
        return sxid_spec(int(m.group(1)))
    return None


def is_known_code(code: str) -> bool:
    return default_spec(code) is not None


@dataclass(frozen=True)
class Override:
    severity: Severity | None = None
    sticky: bool | None = None
    raise_rule: RaiseRule | None = None


class Catalog:
    """Default code meanings with the config's overrides applied."""

    def __init__(self, overrides: Mapping[str, Override] | None = None) -> None:
        self.overrides = dict(overrides or {})
        unknown = sorted(c for c in self.overrides if not is_known_code(c))
        if unknown:
            raise ValueError(f"unknown finding code(s) in overrides: {', '.join(unknown)}")

    def lookup(self, code: str) -> CodeSpec:
        spec = default_spec(code)
        if spec is None:
            # A code a check invented without cataloguing it: loud, but never fatal.
            spec = CodeSpec(code, S.WARN, False, "uncatalogued code")
        over = self.overrides.get(code)
        if over is None:
            return spec
        return replace(
            spec,
            severity=over.severity or spec.severity,
            sticky=spec.sticky if over.sticky is None else over.sticky,
            raise_rule=over.raise_rule or spec.raise_rule,
        )
