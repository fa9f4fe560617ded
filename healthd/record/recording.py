"""`healthd record`: write what this machine's GPUs show as a machine spec.

The recording is read by the same code the checks use (one `NvmlReader` pass through
`NvmlGpuSource`, its XID events, the `pciebw` bandwidth probe, `dcgmi`), and written
in the machine-spec format (docs/machine-spec.md), so `healthd check --sim FILE`
replays it: the same readings, hence the same statuses, codes and values.

How readings map to the spec:
- machine-wide values (`gpus`) come from the first readable GPU; every GPU's own
  values that differ (power, PCIe link, remapped rows, ECC counts, clock event
  reasons, NVLinks down, MIG, lost) are an entry under `faults` active from 0;
- a reading NVML refused (`NOT_SUPPORTED`, or any other NVML error) becomes an
  `nvml_errors` entry naming the function and the error, unless the machine-wide
  capability already says so (`page_retirement: false`, `mig_capable: false`,
  `nvlinks: 0`, `ecc_enabled: false`);
- XIDs seen during the window are `xid` entries at `REPLAYED_XID_AT_S`; fewer GPUs
  than expected are `missing` GPUs at the end;
- what else uses a GPU (the processes NVML lists on it, its PCIe traffic) is a
  `busy` entry; a busy GPU's bandwidth is not measured (the check would not judge
  it, and the copies would disturb the job);
- NVLink fabric info is the `fabric` section (the first registered GPU's) plus
  per-GPU `fabric` faults; the time since boot, in whole minutes, is `uptime_s`;
- the kernel log's XID and SXID lines are `kernel_log`, the RDMA ports' sysfs
  values `rdma.ports`, each GPU's PCI path and its AER counters `aer` (the bridges
  above each GPU, the counters that are not zero, the devices without any); a
  source that could not be read is left out of `recorded`, and the checks that read
  it replay as SKIPPED "not recorded".

`--redact` replaces GPU UUIDs, serials and the node name with placeholders, the same
original always by the same placeholder.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio.to_thread

from checks.aer import sysfs_address
from checks.base import boot_uptime
from checks.busy import KB, assess
from checks.kernel_log import LogUnavailable
from checks.nvml_reader import ECC_DISABLED, RECOVERY_ACTION_FIELD, NvmlReader
from checks.pciebw_probe import ProbeError, measure_within
from checks.power import CLOCK_EVENT_BITS, GPU_IDLE
from checks.probes import (
    AER_KINDS,
    AER_TOTALS,
    AerCounters,
    AerReader,
    Bandwidth,
    BandwidthProbe,
    GpuActivity,
    KernelLogSource,
    PciPath,
    Probes,
    RdmaPort,
    RdmaReader,
)
from checks.processes import ProgramNotFound, ProgramNotRunnable, run_process
from checks.rdma import RdmaUnavailable
from checks.recovery import ACTIONS
from checks.snapshot import (
    Failed,
    GpuSnapshot,
    NodeSnapshot,
    NvmlGpuSource,
    Ok,
    Reading,
    Unsupported,
    XidEvent,
)

REDACTED_NODE = "recorded-node"
# When a replay fires the XIDs heard while recording. NVML delivers an event only to
# the listeners registered when it fires, so an XID at 0 would reach no replaying
# program; half a second after start, `healthd check` (and the agent) listen, and the
# xid check's 1 s window is still open.
REPLAYED_XID_AT_S = 0.5
_VERSION = re.compile(r"version\s*:?\s*([0-9][\w.\-]*)", re.IGNORECASE)
_SERIAL = re.compile(r'("serial(?:_num(?:ber)?)?"\s*:\s*")([^"]*)(")', re.IGNORECASE)


class NothingToRecord(Exception):
    """NVML cannot read this machine (no driver): there is no machine to record."""


@dataclass(frozen=True)
class DcgmRecording:
    """What `dcgmi` said: its version and, when asked, a level-1 diagnostic."""

    version: str = ""
    stdout: str | None = None
    exit: int | None = None


@dataclass
class Recording:
    """Everything read, before it is written as a spec."""

    node: str
    snapshot: NodeSnapshot
    xids: list[XidEvent] = field(default_factory=list)
    bandwidth: dict[int, Bandwidth] = field(default_factory=dict)
    activity: dict[int, GpuActivity] = field(default_factory=dict)  # what else uses each GPU
    busy_not_measured: list[int] = field(default_factory=list)  # GPUs too busy to measure
    dcgm: DcgmRecording | None = None
    expected_gpus: int | None = None
    uptime_s: float | None = None  # seconds since boot when read (the fabric's grace)
    kernel_log: list[str] | None = None  # XID and SXID lines since boot; None: unreadable
    rdma: list[RdmaPort] | None = None  # the RDMA ports; None: unreadable
    aer: dict[str, PciPath] | None = None  # each GPU's PCI path by address; None: unreadable


async def read_machine(
    node: str,
    *,
    xid_window_s: float,
    expected_gpus: int | None = None,
    probes: Probes | None = None,
    bandwidth_size_bytes: int = 64 * 2**20,
    bandwidth_iterations: int = 5,
    bandwidth_timeout_s: float = 30.0,
    busy_gbps: float = 1.0,
    dcgm_command: Sequence[str] | None = None,
) -> Recording:
    """One NVML pass, what else uses each GPU, the XIDs of the window, and what was
    asked for besides: what the checks' `probes` read (the bandwidth only with a
    probe, and only of GPUs not busy by `busy_gbps`; the kernel log and the RDMA ports
    only with a source for them)."""
    probes = probes or Probes()
    gpus = NvmlGpuSource()
    try:
        snapshot = await gpus.snapshot()
        if snapshot.driver_error:
            raise NothingToRecord(snapshot.driver_error)
        activity = await _activity(snapshot, gpus.reader)
        xids = await gpus.xid_events(xid_window_s)
    finally:
        await gpus.aclose()
    recording = Recording(node, snapshot, xids, activity=activity, expected_gpus=expected_gpus,
                          uptime_s=(probes.uptime or boot_uptime)(),
                          kernel_log=_logged_lines(probes.kernel_log),
                          rdma=_rdma_ports(probes.rdma),
                          aer=_pci_paths(probes.aer, snapshot))
    if probes.bandwidth is not None:
        recording.busy_not_measured = [
            index for index, seen in activity.items()
            if assess(seen, traffic_gbps=busy_gbps).busy]
        idle = [gpu for gpu in snapshot.gpus if gpu.index not in recording.busy_not_measured]
        recording.bandwidth = await _measure_all(idle, probes.bandwidth, bandwidth_size_bytes,
                                                 bandwidth_iterations, bandwidth_timeout_s)
    if dcgm_command is not None:
        recording.dcgm = await read_dcgm(dcgm_command)
    return recording


def _logged_lines(log: KernelLogSource | None) -> list[str] | None:
    """The XID and SXID lines the kernel log holds, in the order logged (None: the
    log cannot be read, so the recording says it holds none)."""
    if log is None:
        return None
    try:
        lines = [*log.take("xid"), *log.take("sxid")]
    except LogUnavailable:
        return None
    return [line.message for line in sorted(lines, key=lambda line: line.seq)]


def _rdma_ports(reader: RdmaReader | None) -> list[RdmaPort] | None:
    """The RDMA ports as sysfs shows them (None: they cannot be read)."""
    if reader is None:
        return None
    try:
        return reader.read()
    except RdmaUnavailable:
        return None


def _pci_paths(reader: AerReader | None, snapshot: NodeSnapshot) -> dict[str, PciPath] | None:
    """Each GPU's PCI path and AER counters (None: no GPU's device could be found, so
    this is not the host's sysfs)."""
    if reader is None:
        return None
    addresses = [a for gpu in snapshot.gpus if (a := sysfs_address(gpu.pci_bus_id))]
    paths = dict(reader.read(addresses))
    return paths if any(not path.missing for path in paths.values()) else None


async def _activity(snapshot: NodeSnapshot, reader: NvmlReader) -> dict[int, GpuActivity]:
    """What NVML says uses each readable GPU now (processes, PCIe traffic)."""
    return {gpu.index: await anyio.to_thread.run_sync(reader.activity, gpu.pci_bus_id)
            for gpu in snapshot.gpus if not gpu.lost}


async def _measure_all(gpus: Sequence[GpuSnapshot], probe: BandwidthProbe, size_bytes: int,
                       iterations: int, timeout_s: float) -> dict[int, Bandwidth]:
    """What the pciebw probe measures per GPU; GPUs it cannot measure are left out
    (a lost or MIG GPU fails the same way again on replay)."""
    measured: dict[int, Bandwidth] = {}
    for gpu in gpus:
        if gpu.lost or gpu.mig_enabled:
            continue
        try:
            measured[gpu.index] = await measure_within(probe, gpu.pci_bus_id, size_bytes,
                                                       iterations, timeout_s)
        except ProbeError:
            continue
    return measured


async def read_dcgm(command: Sequence[str], level: int = 1) -> DcgmRecording:
    """`dcgmi --version` and `dcgmi diag -r <level> -j` (its stdout and exit status)."""
    version = ""
    try:
        out = await run_process([*command, "--version"], timeout_s=30)
        match = _VERSION.search(out.stdout)
        version = match.group(1) if match else ""
        diag = await run_process([*command, "diag", "-r", str(level), "-j"], timeout_s=300)
    except (ProgramNotFound, ProgramNotRunnable, OSError, TimeoutError):
        # no usable dcgmi here: the recording keeps the NVML part alone
        return DcgmRecording(version)
    return DcgmRecording(version, diag.stdout, diag.returncode)


# -- the spec ----------------------------------------------------------------------

def machine_spec(recording: Recording, *, redact: bool = False) -> dict[str, Any]:
    """The recording as a machine-spec mapping (validate it before writing)."""
    snap = recording.snapshot
    gpus = list(snap.gpus)
    base = _machine_gpus(gpus)
    fabric = _machine_fabric(gpus)
    refusals = {gpu.index: _refusals(gpu, {**base, "fabric": fabric}) for gpu in gpus}
    unsupported = _unsupported_everywhere([refusals[g.index] for g in gpus if not g.lost])
    if unsupported:
        base["unsupported"] = unsupported
    field_errors = _field_errors_everywhere(gpus)
    if field_errors:
        base["field_errors"] = field_errors
    faults = []
    for gpu in gpus:
        errors = [e for e in refusals[gpu.index]
                  if e["error"] != "NOT_SUPPORTED" or e["function"] not in unsupported]
        entry = _gpu_entry(gpu, {**base, "fabric": fabric}, errors, recording)
        if entry:
            faults.append(entry)
    count = len(gpus)
    if recording.expected_gpus is not None and recording.expected_gpus > count:
        faults += [{"gpu": i, "missing": True} for i in range(count, recording.expected_gpus)]
        count = recording.expected_gpus
    uuids = [gpu.uuid for gpu in gpus] + [f"GPU-missing-{i}" for i in range(len(gpus), count)]
    bus_ids = [gpu.pci_bus_id for gpu in gpus] + [""] * (count - len(gpus))
    spec: dict[str, Any] = {"node": recording.node, "driver_version": snap.driver_version}
    if snap.cuda_driver_version:
        spec["cuda_driver_version"] = snap.cuda_driver_version
    if recording.uptime_s is not None:  # whole minutes: enough for the fabric's grace
        spec["uptime_s"] = int(recording.uptime_s // 60 * 60)
    spec["gpus"] = {"count": count, **base, "uuids": uuids, "pci_bus_ids": bus_ids}
    if fabric is not None:
        spec["fabric"] = fabric
    spec["faults"] = faults
    if recording.kernel_log:
        spec["kernel_log"] = recording.kernel_log
    if recording.rdma:
        spec["rdma"] = {"ports": [_rdma_entry(port) for port in recording.rdma]}
    if recording.aer is not None:
        spec["aer"] = _aer_entry(recording.aer, gpus)
    if recording.dcgm is not None:
        spec["dcgm"] = _dcgm_entry(recording.dcgm)
    spec["recorded"] = sources(recording)
    return redacted(spec) if redact else spec


def sources(recording: Recording) -> list[str]:
    """What the recording holds, by the names checks give their INPUTS: a replay
    runs only the checks whose inputs are all here (healthd.sim.recorded)."""
    held = ["nvml", "xid"]  # one NVML pass and the window's XIDs, always
    if recording.bandwidth or recording.busy_not_measured:  # busy GPUs replay as busy
        held.append("pciebw")
    if recording.dcgm is not None and recording.dcgm.stdout is not None:
        held.append("dcgm")
    if recording.kernel_log is not None:  # read, even if it held no NVIDIA line
        held.append("kernel_log")
    if recording.rdma is not None:
        held.append("rdma")
    if recording.aer is not None:
        held.append("aer")
    return held


def _machine_gpus(gpus: Sequence[GpuSnapshot]) -> dict[str, Any]:
    """The `gpus` defaults: the first readable GPU's values and what any GPU supports."""
    readable = [gpu for gpu in gpus if not gpu.lost]
    base: dict[str, Any] = {"model": next((g.model for g in readable if g.model), "")}
    power = next((g.power.value for g in readable if isinstance(g.power, Ok)), None)
    if power is not None:
        base["power"] = {"usage_w": power.usage_w, "limit_w": power.limit_w}
    link = next((g.pcie.value for g in readable if isinstance(g.pcie, Ok)), None)
    if link is not None:
        base["pcie"] = {"gen": link.gen, "width": link.width, "max_gen": link.max_gen,
                        "max_width": link.max_width}
    base["nvlinks"] = max((len(g.nvlinks.value) for g in readable
                           if isinstance(g.nvlinks, Ok)), default=0)
    base["ecc_enabled"] = any(not _ecc_disabled(g.ecc) for g in readable) or not readable
    base["mig_capable"] = any(not _not_supported(g.mig_mode) for g in readable)
    base["page_retirement"] = any(isinstance(g.retired_pages_pending, Ok) for g in readable)
    return base


def _machine_fabric(gpus: Sequence[GpuSnapshot]) -> dict[str, Any] | None:
    """The machine's `fabric` section: the first registered GPU's fabric info (None:
    no GPU is in a fabric, a PCIe board)."""
    fabric = next((g.fabric.value for g in gpus if not g.lost and isinstance(g.fabric, Ok)),
                  None)
    if fabric is None:
        return None
    return {"state": fabric.state, "status": fabric.status, "clique_id": fabric.clique_id,
            "cluster_uuid": "" if not fabric.cluster_uuid.strip("0") else fabric.cluster_uuid}


def _refusals(gpu: GpuSnapshot, base: dict[str, Any]) -> list[dict[str, str]]:
    """The GPU's readings NVML refused that the machine's capabilities do not explain."""
    if gpu.lost:
        return []
    refusals: list[dict[str, str]] = []
    for name, reading in _readings(gpu):
        if isinstance(reading, Ok) or _said_by_machine(name, reading, base) \
                or _is_field_error(name, reading):
            continue
        error = _nvml_error(reading)
        # a failed handle lookup fails every reading alike: one entry says it
        if error is not None and error not in refusals:
            refusals.append(error)
    return refusals


def _is_field_error(name: str, reading: Unsupported | Failed) -> bool:
    """A field nvmlDeviceGetFieldValues refused (the recovery action): written as
    `field_errors`, not as an error of the whole call."""
    return name == "recovery_action" and isinstance(reading, Unsupported)


def _field_errors(gpu: GpuSnapshot) -> dict[int, str]:
    """The fields this GPU refused, by field id, with the error each answered."""
    reading = gpu.recovery_action
    if isinstance(reading, Unsupported) and reading.error:
        return {RECOVERY_ACTION_FIELD: reading.error}
    return {}


def _field_errors_everywhere(gpus: Sequence[GpuSnapshot]) -> dict[int, str]:
    """Field errors every readable GPU answers alike (`gpus.field_errors`)."""
    answers = [_field_errors(gpu) for gpu in gpus if not gpu.lost]
    return answers[0] if answers and all(a == answers[0] for a in answers) else {}


def _unsupported_everywhere(refusals: Sequence[list[dict[str, str]]]) -> list[str]:
    """Functions every readable GPU answers NOT_SUPPORTED (`gpus.unsupported`)."""
    if not refusals:
        return []
    first, *others = [{e["function"] for e in errors if e["error"] == "NOT_SUPPORTED"}
                      for errors in refusals]
    return sorted(first.intersection(*others))


def _gpu_entry(gpu: GpuSnapshot, base: dict[str, Any], errors: list[dict[str, str]],
               recording: Recording) -> dict[str, Any]:
    """One GPU's values that differ from the machine's, as a fault entry from 0."""
    entry: dict[str, Any] = {"lost": True} if gpu.lost else {}
    for name, reading in [] if gpu.lost else _readings(gpu):
        if isinstance(reading, Ok):
            for key, value in _values(name, reading.value, base).items():
                # ECC counts and pending retirements share the `ecc` entry
                entry[key] = {**entry[key], **value} if key in entry else value
    if errors:
        entry["nvml_errors"] = errors
    field_errors = {} if gpu.lost or base.get("field_errors") else _field_errors(gpu)
    if field_errors:
        entry["field_errors"] = field_errors
    measured = recording.bandwidth.get(gpu.index)
    if measured is not None:
        entry["pcie_bandwidth_gbps"] = {"h2d": measured.h2d_gbps, "d2h": measured.d2h_gbps}
    busy = _busy_entry(recording.activity.get(gpu.index))
    if busy:
        entry["busy"] = busy
    xids = [{"code": e.xid, "at": REPLAYED_XID_AT_S} for e in recording.xids
            if _event_on(e, gpu)]
    if xids:
        entry["xid"] = xids
    return {"gpu": gpu.index, **entry} if entry else {}


def _busy_entry(activity: GpuActivity | None) -> dict[str, Any]:
    """The `busy` fault that makes NVML show this again: the processes it listed and
    the traffic, to 0.1 GB/s (an idle link's housekeeping rounds away). Unreadable
    parts replay as idle."""
    if activity is None:
        return {}
    rx, tx = (round((kbps or 0) * KB / 1e9, 1) for kbps in (activity.rx_kbps, activity.tx_kbps))
    processes = len(activity.pids or ())
    if not (processes or rx or tx):
        return {}
    return {"processes": processes, "pcie_rx_gbps": rx, "pcie_tx_gbps": tx}


def _readings(gpu: GpuSnapshot) -> list[tuple[str, Reading[Any]]]:
    return [("mig_mode", gpu.mig_mode), ("remapped", gpu.remapped),
            ("clock_event_reasons", gpu.clock_event_reasons), ("power", gpu.power),
            ("pcie", gpu.pcie), ("pcie_replays", gpu.pcie_replays), ("ecc", gpu.ecc),
            ("retired_pages_pending", gpu.retired_pages_pending), ("nvlinks", gpu.nvlinks),
            ("fabric", gpu.fabric), ("recovery_action", gpu.recovery_action)]


def _values(name: str, value: Any, base: dict[str, Any]) -> dict[str, Any]:
    """Spec fields for one readable property, when it differs from the defaults."""
    if name == "mig_mode":
        return {"mig": True} if value else {}
    if name == "remapped":
        rows = {"correctable": value.correctable, "uncorrectable": value.uncorrectable,
                "pending": value.pending, "failure": value.failure}
        return {"remapped_rows": rows} if any(rows.values()) else {}
    if name == "clock_event_reasons":
        return {} if value == GPU_IDLE else _clock_fields(int(value))
    if name == "power":
        power = {"usage_w": value.usage_w, "limit_w": value.limit_w}
        return {} if power == base.get("power") else {"power": power}
    if name == "pcie":
        link = {"gen": value.gen, "width": value.width, "max_gen": value.max_gen,
                "max_width": value.max_width}
        return {} if link == base.get("pcie") else {"pcie": link}
    if name == "pcie_replays":
        return {"pcie_replays": int(value)} if value else {}
    if name == "ecc":
        if not value.corrected_volatile and not value.uncorrected_volatile:
            return {}
        return {"ecc": {"corrected_volatile": value.corrected_volatile,
                        "uncorrected_volatile": value.uncorrected_volatile}}
    if name == "retired_pages_pending":
        return {"ecc": {"retired_pages_pending": True}} if value else {}
    if name == "nvlinks":
        down = [link.link for link in value if not link.up]
        return {"nvlink_down": down} if down else {}
    if name == "recovery_action":  # a name the spec knows, else NVML's number
        return {"recovery_action": ACTIONS.get(value, value)} if value else {}
    if name == "fabric":
        machine = base.get("fabric") or {}
        mine = {"state": value.state, "status": value.status}
        return {"fabric": mine} if any(machine.get(k) != v for k, v in mine.items()) else {}
    return {}


def _clock_fields(mask: int) -> dict[str, Any]:
    names = [name for bit, name in CLOCK_EVENT_BITS.items() if mask & bit]
    if mask and sum(bit for bit in CLOCK_EVENT_BITS if mask & bit) == mask:
        return {"clock_event_reasons": names}
    return {"clock_event_mask": mask}  # no reason at all, or bits newer than the names


def _said_by_machine(name: str, reading: Unsupported | Failed, base: dict[str, Any]) -> bool:
    """Whether the machine-wide capability already makes NVML answer this way."""
    if name == "ecc" and _ecc_disabled(reading):
        return True
    if name == "fabric" and base.get("fabric") is None:
        return isinstance(reading, Unsupported)  # no fabric on this machine at all
    if not _not_supported(reading):
        return False
    capability = {"mig_mode": "mig_capable", "retired_pages_pending": "page_retirement",
                  "nvlinks": "nvlinks"}.get(name)
    return capability is not None and not base[capability]


def _nvml_error(reading: Unsupported | Failed) -> dict[str, str] | None:
    """The spec's `nvml_errors` entry that makes NVML answer the same again. A code
    without an NVML_ERROR_* name, or a failure that was no NVML error at all (a
    binding surprise), replays as UNKNOWN: the best the format can say."""
    if not reading.function:
        return None
    error = reading.error if reading.error and not reading.error.isdigit() else "UNKNOWN"
    return {"function": reading.function, "error": error}


def _not_supported(reading: Reading[Any]) -> bool:
    return isinstance(reading, Unsupported) and reading.error == "NOT_SUPPORTED"


def _ecc_disabled(reading: Reading[Any]) -> bool:
    return isinstance(reading, Unsupported) and reading.reason == ECC_DISABLED


def _event_on(event: XidEvent, gpu: GpuSnapshot) -> bool:
    if event.uuid and gpu.uuid:
        return event.uuid == gpu.uuid
    return event.gpu_index == gpu.index


def _rdma_entry(port: RdmaPort) -> dict[str, Any]:
    """One port of the spec's `rdma` section, everything sysfs showed."""
    entry: dict[str, Any] = {"device": port.device, "port": port.port, "state": port.state,
                             "phys_state": port.phys_state, "link_layer": port.link_layer}
    if port.rate_gbps is not None:
        entry["rate_gbps"] = port.rate_gbps
    if port.netdevs:
        entry["netdev"] = port.netdevs[0]
    if port.counters:
        entry["counters"] = dict(port.counters)
    return entry


def _aer_entry(paths: dict[str, PciPath], gpus: Sequence[GpuSnapshot]) -> dict[str, Any]:
    """The spec's `aer` section: every GPU's bridges, the counters that are not zero,
    the devices without counters (`supported: false` when none has any)."""
    upstream = {gpu.index: list(path.devices[1:]) for gpu in gpus
                if (path := paths.get(sysfs_address(gpu.pci_bus_id))) and not path.missing}
    counts: dict[str, Any] = {}
    without: list[str] = []
    for path in paths.values():
        for device in path.devices:
            if device in path.counters:
                if nonzero := _aer_counts(path.counters[device]):
                    counts[device] = nonzero
            elif device not in without:
                without.append(device)
    if not any(path.counters for path in paths.values()):
        return {"supported": False, "upstream": upstream}
    entry: dict[str, Any] = {"upstream": upstream}
    if counts:
        entry["counts"] = counts
    if without:
        entry["without_aer"] = without
    return entry


def _aer_counts(counters: AerCounters) -> dict[str, dict[str, int]]:
    """A device's counters that are not zero, by kind; the total only where it is not
    the counters' sum (several errors in one message, or types without a name)."""
    out: dict[str, dict[str, int]] = {}
    for kind in AER_KINDS:
        named = {name: n for name, n in counters.named(kind).items() if n}
        if counters.total(kind) != sum(named.values()):
            named[AER_TOTALS[kind]] = counters.total(kind)
        if named:
            out[kind] = named
    return out


def _dcgm_entry(dcgm: DcgmRecording) -> dict[str, Any]:
    entry: dict[str, Any] = {}
    if dcgm.version:
        entry["version"] = dcgm.version
    if dcgm.stdout is not None:
        entry["stdout"] = dcgm.stdout
        entry["exit"] = dcgm.exit
    return entry


# -- redaction ---------------------------------------------------------------------

def redacted(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec with UUIDs, serials and the node name replaced, consistently."""
    out = {**spec, "node": REDACTED_NODE}
    gpus = dict(spec["gpus"])
    placeholders = {uuid: _placeholder_uuid(i) for i, uuid in enumerate(gpus["uuids"]) if uuid}
    gpus["uuids"] = [placeholders.get(uuid, uuid) for uuid in gpus["uuids"]]
    out["gpus"] = gpus
    dcgm = spec.get("dcgm")
    if dcgm and dcgm.get("stdout"):
        text: str = dcgm["stdout"]
        for original, placeholder in placeholders.items():
            text = text.replace(original, placeholder)
        out["dcgm"] = {**dcgm, "stdout": _redact_serials(text)}
    return out


def _placeholder_uuid(index: int) -> str:
    return f"GPU-00000000-0000-0000-0000-{index:012d}"


def _redact_serials(text: str) -> str:
    serials: dict[str, str] = {}

    def replace(match: re.Match[str]) -> str:
        placeholder = serials.setdefault(match.group(2), f"SERIAL-{len(serials):04d}")
        return f"{match.group(1)}{placeholder}{match.group(3)}"

    return _SERIAL.sub(replace, text)
