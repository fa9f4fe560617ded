"""What starting `healthd agent` loads: none of the large libraries it does not use
on every node (each costs the DaemonSet's memory on every GPU node; the figure is
bench/agent_footprint.py's). They load when something asks for them."""

from __future__ import annotations

import subprocess
import sys

AGENT_IMPORTS = "import healthd.cli, healthd.agent.command"
NOT_LOADED = (
    "kubernetes.client",  # the synchronous client, with all its models
    "kubernetes.aio.client.api.core_v1_api",  # generated API classes
    "kubernetes.aio.client.models.v1_pod",  # generated model classes
    "pyroute2",  # the nic check's netlink reader: only on its first read
    "aiohttp.web",  # a web framework, for three read-only paths
    "healthd.sim.apiserver",  # the API emulator
)


def loaded_after(code: str) -> set[str]:
    listing = "print('\\n'.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", f"{code}\nimport sys\n{listing}"],
                         capture_output=True, text=True, check=True, timeout=120).stdout
    return set(out.split())


def test_the_agent_starts_without_the_libraries_it_does_not_use() -> None:
    loaded = loaded_after(AGENT_IMPORTS)
    assert "healthd.agent.agent" in loaded and "healthd.kube.client" in loaded
    assert not loaded & set(NOT_LOADED)


def test_the_nic_check_loads_netlink_when_it_reads_a_link() -> None:
    code = ("import anyio\nfrom checks.nic import NetlinkReader\n"
            "anyio.run(NetlinkReader().read, ['lo'])")
    assert "pyroute2" in loaded_after(code)
