"""The simulated RDMA NICs: a fake `/sys/class/infiniband` tree in the machine's work
directory, read by the real sysfs reader (checks.rdma.SysfsRdmaReader), written from
the machine spec's `rdma` section. Tests change a port while checks run (`set_port`,
or the control file's `rdma_port` line), as a cable pulled, a switch port disabled or
a flaky link counting errors would.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from checks.probes import RdmaPort
from checks.rdma import RdmaUnavailable
from healthd.sim.machine import RdmaPortSpec, RdmaSpec

NOT_RECORDED = "not recorded"
# The numbers sysfs prints before each name (include/rdma/ib_verbs.h).
_STATE_NUMBERS = {"DOWN": 1, "INIT": 2, "ARMED": 3, "ACTIVE": 4, "ACTIVE_DEFER": 5}
_PHYS_NUMBERS = {"Sleep": 1, "Polling": 2, "Disabled": 3, "PortConfigurationTraining": 4,
                 "LinkUp": 5, "LinkErrorRecovery": 6, "Phy Test": 7}
_WIDTH = {"InfiniBand": "4X NDR", "Ethernet": "4X"}
CHANGEABLE = frozenset({"state", "phys_state", "rate_gbps", "counters"})  # at run time


def ports_of(spec: RdmaSpec) -> list[RdmaPortSpec]:
    """Every port the section describes: the generated ones, overridden or added to."""
    ports = {(f"mlx5_{i}", 1): RdmaPortSpec(device=f"mlx5_{i}", netdev=f"net{i + 1}")
             for i in range(spec.devices)}
    for port in spec.ports:
        ports[(port.device, port.port)] = port
    return list(ports.values())


class SimRdma:
    """The fake sysfs tree under `root` (`root/<device>/ports/<n>/...`)."""

    def __init__(self, root: Path, spec: RdmaSpec) -> None:
        self.root = root
        self.spec = spec
        root.mkdir(parents=True, exist_ok=True)
        for port in ports_of(spec):
            self._write(port)

    def set_port(self, device: str, port: int = 1, **changes: Any) -> None:
        """Show one port from now on as the spec describes it with `changes` (`state`,
        `phys_state`, `rate_gbps`, `counters`): no change puts the spec's state and rate
        back; counters not named keep what they show. ValueError for a port the
        machine lacks or a change the spec would refuse."""
        fixed = sorted(set(changes) - CHANGEABLE)
        if fixed:
            raise ValueError(f"cannot change {', '.join(fixed)} of a port "
                             f"(only {', '.join(sorted(CHANGEABLE))})")
        ports = {(p.device, p.port): p for p in ports_of(self.spec)}
        current = ports.get((device, port))
        if current is None:
            raise ValueError(f"no RDMA port {device}/{port} (the machine has "
                             f"{', '.join(f'{d}/{n}' for d, n in ports) or 'none'})")
        self._write(RdmaPortSpec.model_validate({**current.model_dump(), **changes}))

    def _put(self, path: Path, text: str) -> None:
        """Replace a file whole: a reader (the agent, another process) never sees it
        empty or half written, as it never sees a real sysfs attribute so."""
        # Staged beside the tree, never in it: readers list its folders.
        writer = f"{os.getpid()}.{threading.get_ident()}"
        staged = self.root.parent / f".{self.root.name}-{path.name}.{writer}"
        staged.write_text(text)
        os.replace(staged, path)

    def _write(self, port: RdmaPortSpec) -> None:
        base = self.root / port.device / "ports" / str(port.port)
        (base / "counters").mkdir(parents=True, exist_ok=True)
        layer = port.link_layer or self.spec.link_layer
        rate = port.rate_gbps or self.spec.rate_gbps
        files = {
            "state": f"{_STATE_NUMBERS.get(port.state, 0)}: {port.state}",
            "phys_state": f"{_PHYS_NUMBERS.get(port.phys_state, 0)}: {port.phys_state}",
            "link_layer": layer,
            "rate": f"{rate:g} Gb/sec ({_WIDTH[layer]})",
        }
        for name, text in files.items():
            self._put(base / name, text + "\n")
        for name, value in port.counters.items():
            self._put(base / "counters" / name, f"{value}\n")
        if port.netdev:
            (self.root / port.device / "device" / "net" / port.netdev).mkdir(
                parents=True, exist_ok=True)


class NotRecordedRdma:
    """The RDMA ports of a recording that holds none (checks.rdma.RdmaReader)."""

    def read(self) -> list[RdmaPort]:
        raise RdmaUnavailable(NOT_RECORDED, not_recorded=True)
