"""`checks.rdma.params.sysfs_root` under `--sim`: the rdma check reads the root the
config names, as it does on a node (a tree the test prepared and changes itself),
in `healthd check --sim` and in an agent; left at its default, it reads the
machine spec's ports."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from healthd.cli import main
from healthd.config import Config
from healthd.sim.apiserver import ApiEmulator
from healthd.sim.machine import MachineSpec, RdmaSpec, load_machine_spec
from healthd.sim.rdma import SimRdma
from tests.agent.harness import eventually, fast_config, running_agent

HGX = MachineSpec.model_validate({**load_machine_spec("healthy-8xh100").model_dump(),
                                  "rdma": {"devices": 2}})  # every port ACTIVE


def own_tree(tmp_path: Path) -> SimRdma:
    """A sysfs tree of the test's own: one port, down."""
    tree = SimRdma(tmp_path / "sys-infiniband", RdmaSpec(devices=1))
    tree.set_port("mlx5_0", state="DOWN", phys_state="Disabled")
    return tree


def rdma_codes(capsys: pytest.CaptureFixture[str], tmp_path: Path,
               params: dict[str, Any]) -> set[str]:
    spec, config = tmp_path / "hgx.yaml", tmp_path / "healthd.yaml"
    spec.write_text(HGX.model_dump_json())
    config.write_text(json.dumps({"checks": {"rdma": {"params": params}}}))
    main(["check", "--sim", str(spec), "--checks", "rdma", "--config", str(config),
          "--output", "json"])
    (rdma,) = json.loads(capsys.readouterr().out)["checks"]
    return {f["code"] for f in rdma["findings"]}


def test_a_one_shot_check_reads_the_configured_root(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    tree = own_tree(tmp_path)
    assert rdma_codes(capsys, tmp_path, {"sysfs_root": str(tree.root)}) == {"RDMA_PORT_DOWN"}
    assert "not the machine spec's rdma section" in caplog.text
    assert rdma_codes(capsys, tmp_path, {}) == set()  # the spec's ports, all up


def with_rdma_root(root: Path) -> Config:
    config = fast_config()
    rdma = config.checks["xid"].model_copy(update={"interval": 0.5,
                                                  "params": {"sysfs_root": str(root)}})
    return config.model_copy(update={"checks": {**config.checks, "rdma": rdma}})


@pytest.mark.anyio
async def test_an_agent_reads_the_configured_root_and_what_the_test_changes_there(
        api: ApiEmulator, tmp_path: Path) -> None:
    tree = own_tree(tmp_path)
    async with running_agent(api, tmp_path, spec=HGX, config=with_rdma_root(tree.root)) as h:
        await eventually(lambda: h.verdict() == "ERR", 10, "ERR: the configured port is down")
        tree.set_port("mlx5_0")  # the test repairs its own tree
        await eventually(lambda: h.metric("healthd_check_status", node=h.agent.node,
                                          check="rdma", status="PASS") == 1, 10,
                         "a passing rdma run on the repaired tree")
