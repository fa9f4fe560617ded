"""The agent's memory limit holds what the agent really uses, as rendered for every
flavour: its RSS with real NVML, and beside it while pciebw measures a GPU, the child
that measures (its interpreter, the CUDA context, the pinned host buffer at the size
the shipped config asks for: page-locked memory is charged to the container), dcgmi,
any memory-backed volume (a tmpfs is charged too), and a margin. A bigger `size_mib`
without a bigger limit fails here, not with an OOM kill on the first hourly bandwidth
run."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from checks.pciebw import PcieBwCheck, PcieBwParams
from healthd.capacity.quantities import parse_quantity
from healthd.config import Config, load_config
from tests.deploy.manifests import OVERLAYS, Obj, find, one, render

MIB = Decimal(2**20)
# Steady RSS of `healthd agent` on a real H200 with real NVML (bench/RESULTS.md).
BASELINE_RSS_MIB = Decimal("101.8")
# The pciebw child's interpreter, measured (bench/pciebw_child: peak RSS without CUDA),
# and its CUDA driver and context on the H200 (1,211 MiB peak after a 1 GiB copy,
# less 90 MiB before it, less the buffer).
CHILD_INTERPRETER_MIB = Decimal("13.3")
CUDA_CONTEXT_MIB = Decimal(97)
# An allowance, not yet measured on a GPU: a dcgmi client process.
DCGMI_MIB = Decimal(32)
MARGIN = Decimal("1.25")


def agent_config(objects: list[Obj], tmp_path: Path) -> Config:
    (cm,) = find(objects, "ConfigMap")
    path = tmp_path / "config.yaml"
    path.write_text(cm["data"]["config.yaml"])
    return load_config(path, env={})


def pinned_buffer_mib(config: Config) -> Decimal:
    check = config.build_check("pciebw", None)
    assert isinstance(check, PcieBwCheck)
    return Decimal(check.settings.size_mib) if config.check_section("pciebw").enabled else \
        Decimal(0)


def memory_volumes_mib(pod_spec: Obj) -> Decimal:
    return sum((parse_quantity(v["emptyDir"].get("sizeLimit", "0")) / MIB
                for v in pod_spec.get("volumes", [])
                if v.get("emptyDir", {}).get("medium") == "Memory"), Decimal(0))


@pytest.mark.parametrize("flavour", list(OVERLAYS))
def test_the_agent_memory_limit_covers_what_it_uses(flavour: str, tmp_path: Path) -> None:
    objects = render(OVERLAYS[flavour])
    pod_spec = one(objects, "DaemonSet", "healthd-agent")["spec"]["template"]["spec"]
    (agent,) = pod_spec["containers"]
    limit_mib = parse_quantity(agent["resources"]["limits"]["memory"]) / MIB
    request_mib = parse_quantity(agent["resources"]["requests"]["memory"]) / MIB
    buffer_mib = pinned_buffer_mib(agent_config(objects, tmp_path))
    assert buffer_mib >= PcieBwParams().size_mib  # the shipped config keeps the default

    needed = (BASELINE_RSS_MIB + CHILD_INTERPRETER_MIB + CUDA_CONTEXT_MIB + buffer_mib
              + DCGMI_MIB + memory_volumes_mib(pod_spec)) * MARGIN
    assert limit_mib >= needed, f"limit {limit_mib} MiB < {needed:.0f} MiB needed"
    assert request_mib >= BASELINE_RSS_MIB  # scheduled for what it uses between tests


def test_a_bigger_buffer_needs_a_bigger_limit(tmp_path: Path) -> None:
    """The sum above is not vacuous: a 1 GiB copy buffer does not fit the limit."""
    objects = render(OVERLAYS["gpu-operator"])
    (agent,) = one(objects, "DaemonSet", "healthd-agent")["spec"]["template"]["spec"][
        "containers"]
    limit_mib = parse_quantity(agent["resources"]["limits"]["memory"]) / MIB
    path = tmp_path / "config.yaml"
    path.write_text("checks: {pciebw: {interval: 1h, params: {size_mib: 1024}}}\n")
    bigger = pinned_buffer_mib(load_config(path, env={}))
    assert (BASELINE_RSS_MIB + CHILD_INTERPRETER_MIB + CUDA_CONTEXT_MIB + bigger
            + DCGMI_MIB) * MARGIN > limit_mib
