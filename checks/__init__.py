"""The check library: one module per check, listed in the static REGISTRY below.

Knows GPUs, networks and storage; knows nothing of labels, schedules or the agent
(it never imports `healthd`). Order matters: it is the order of `healthd check`'s
output and of the default (`all`) set.
"""

from __future__ import annotations

from checks.aer import AerCheck
from checks.base import BaseCheck
from checks.dcgm import DcgmCheck
from checks.ecc import EccCheck
from checks.fabric import FabricCheck
from checks.gpus import GpusCheck
from checks.nic import NicCheck
from checks.nvlink import NvlinkCheck
from checks.pcie import PcieCheck
from checks.pciebw import PcieBwCheck
from checks.ping import PingCheck
from checks.power import PowerCheck
from checks.pvc import PvcCheck
from checks.rdma import RdmaCheck
from checks.recovery import RecoveryCheck
from checks.remapped import RemappedCheck
from checks.sxid import SxidCheck
from checks.xid import XidCheck

_ALL: tuple[type[BaseCheck], ...] = (
    GpusCheck,
    RemappedCheck,
    RecoveryCheck,
    PowerCheck,
    PcieCheck,
    AerCheck,
    EccCheck,
    NvlinkCheck,
    FabricCheck,
    XidCheck,
    SxidCheck,
    PcieBwCheck,
    PingCheck,
    NicCheck,
    RdmaCheck,
    PvcCheck,
    DcgmCheck,
)

REGISTRY: dict[str, type[BaseCheck]] = {cls.NAME: cls for cls in _ALL}
