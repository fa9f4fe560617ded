"""`healthd record`: the command line around healthd.record.recording.

    healthd record [--output FILE] [--include xid-window=D] [--include pciebw]
                   [--include dcgm] [--redact] [--config FILE] [--sim SPEC]

Exit statuses: 0 written; 3 no NVIDIA driver (nothing to record); 64 usage error;
73 an --output that cannot be written (checked before recording);
78 bad config or machine spec.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

import anyio
import yaml

from checks.aer import AerParams, SysfsAerReader
from checks.base import boot_uptime
from checks.dcgm import DcgmCheck, DcgmParams
from checks.kernel_log import KernelLog
from checks.pciebw import MIB, PcieBwCheck
from checks.pciebw_probe import ChildBandwidthProbe
from checks.probes import Probes
from checks.rdma import RdmaParams, SysfsRdmaReader
from healthd import __version__
from healthd.check.once import node_name
from healthd.config import Config, add_config_argument, config_or_exit
from healthd.record.recording import NothingToRecord, machine_spec, read_machine
from healthd.util.durations import parse_duration
from healthd.util.exits import EX_CANTCREAT, EX_CONFIG, ExitError, UsageError

EX_NO_DRIVER = 3  # UNKNOWN in the Nagios convention `healthd check` follows
DEFAULT_XID_WINDOW_S = 2.0


@dataclass(frozen=True)
class Includes:
    xid_window_s: float = DEFAULT_XID_WINDOW_S
    pciebw: bool = False
    dcgm: bool = False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output", metavar="FILE", help="write the spec here (default: stdout)")
    parser.add_argument(
        "--include", action="append", default=[], metavar="WHAT",
        help="xid-window=D (listen for XIDs this long, default 2s), pciebw (measure "
        "PCIe bandwidth), dcgm (run a dcgmi level-1 diagnostic); repeatable")
    parser.add_argument("--redact", action="store_true",
                        help="replace GPU UUIDs, serials and the node name with placeholders")
    add_config_argument(parser, help="healthd config YAML (checks' params)")
    parser.add_argument("--sim", metavar="SPEC",
                        help="record a simulated machine (YAML file or bundled name)")


def parse_includes(values: list[str]) -> Includes:
    window, pciebw, dcgm = DEFAULT_XID_WINDOW_S, False, False
    for value in (part.strip() for item in values for part in item.split(",")):
        name, _, arg = value.partition("=")
        if name == "xid-window" and arg:
            try:
                window = parse_duration(arg)
            except ValueError as exc:
                raise UsageError(f"--include {value}: {exc}") from exc
        elif name == "pciebw" and not arg:
            pciebw = True
        elif name == "dcgm" and not arg:
            dcgm = True
        else:
            raise UsageError(f"--include {value!r}: expected xid-window=D, pciebw or dcgm")
    return Includes(window, pciebw, dcgm)


def run(args: argparse.Namespace) -> int:
    """`healthd record`; its ExitError goes to healthd.cli, which prints it."""
    includes = parse_includes(args.include)
    config = config_or_exit(args.config)
    output = writable_output(args.output) if args.output else None  # before recording
    try:
        document = anyio.run(_record, args, includes, config)
    except NothingToRecord as exc:
        print(f"healthd: {exc}: nothing to record on this machine", file=sys.stderr)
        return EX_NO_DRIVER
    if output is not None:
        try:
            output.write_text(document)
        except OSError as exc:
            raise ExitError(f"cannot write {output}: {exc.strerror}", EX_CANTCREAT) from exc
        print(f"healthd: recorded {output}", file=sys.stderr)
    else:
        sys.stdout.write(document)
    return 0


def writable_output(text: str) -> Path:
    """The --output file, once it is known it can be written (ExitError EX_CANTCREAT
    naming why not), so a recording is never taken only to be lost."""
    path = Path(text)
    if path.is_dir():
        raise ExitError(f"--output {text}: is a directory; name a file in it", EX_CANTCREAT)
    if not path.parent.is_dir():
        raise ExitError(f"--output {text}: directory {path.parent} does not exist",
                        EX_CANTCREAT)
    if not os.access(path.parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise ExitError(f"--output {text}: not writable", EX_CANTCREAT)
    return path


async def _record(args: argparse.Namespace, includes: Includes, config: Config) -> str:
    bandwidth = cast(PcieBwCheck, config.build_check("pciebw")).settings
    dcgm_params = cast(DcgmParams, cast(DcgmCheck, config.build_check("dcgm", "1")).params)
    dcgm_command: list[str] = list(dcgm_params.command)
    node, expected = config.node_name or "", config.expected_gpus
    probes = Probes(bandwidth=ChildBandwidthProbe(), uptime=boot_uptime, kernel_log=KernelLog(),
                    rdma=SysfsRdmaReader(Path(
                        cast(RdmaParams, config.build_check("rdma").params).sysfs_root)),
                    aer=SysfsAerReader(Path(
                        cast(AerParams, config.build_check("aer").params).sysfs_root)))
    with ExitStack() as stack:
        if args.sim:
            from healthd.sim.dcgm import fake_dcgmi_command
            from healthd.sim.node import SimulationError, simulate

            try:
                sim = stack.enter_context(simulate(args.sim))
            except SimulationError as exc:
                raise ExitError(str(exc), EX_CONFIG) from exc
            probes = sim.check_probes()  # what `healthd check --sim` measures with
            dcgm_command = fake_dcgmi_command(sim.spec.dcgm)
            node = node or sim.spec.node
            expected = sim.spec.gpus.count if expected is None else expected
        if not includes.pciebw:
            probes = replace(probes, bandwidth=None)
        recording = await read_machine(
            node or node_name(config), xid_window_s=includes.xid_window_s,
            expected_gpus=expected, probes=probes,
            bandwidth_size_bytes=bandwidth.size_mib * MIB,
            bandwidth_iterations=bandwidth.iterations,
            bandwidth_timeout_s=bandwidth.probe_timeout_s, busy_gbps=bandwidth.busy_gbps,
            dcgm_command=dcgm_command if includes.dcgm else None)
    spec = machine_spec(recording, redact=args.redact)
    _validate(spec)
    return _header() + yaml.dump(spec, Dumper=_SpecDumper, sort_keys=False, width=100)


def _validate(spec: dict[str, Any]) -> None:
    """A recording must load as a spec; if it does not, that is healthd's bug."""
    from healthd.sim.machine import MachineSpecError, parse_machine_spec

    try:
        parse_machine_spec(spec, origin="recording")
    except MachineSpecError as exc:
        raise ExitError(f"the recording is not a valid machine spec (a bug): {exc}", 1) from exc


def _header() -> str:
    now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    return (f"# Recorded by healthd record {__version__} at {now}.\n"
            "# Replay: healthd check --sim THIS_FILE (format: docs/machine-spec.md).\n")


class _SpecDumper(yaml.SafeDumper):
    """Block style for long strings (the dcgmi report stays readable)."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_SpecDumper.add_representer(str, _str)
