"""A leader that dies in the middle of a repair: the state is on the Node, so the next
leader neither repeats a step nor loses one."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from healthd.sim.apiserver import ApiEmulator
from healthd.util.times import rfc3339
from tests.agent.harness import NODE, eventually
from tests.controller.conftest import KubeFactory, controllers
from tests.controller_repairs.conftest import REPAIR, REPAIR_NS, cluster, controller_config

pytestmark = pytest.mark.anyio
JOBS = rf"/apis/batch/v1/namespaces/{REPAIR_NS}/jobs"


async def test_a_leader_killed_between_the_annotation_and_the_job_repairs_once(
        api: ApiEmulator, kube_for: KubeFactory, tmp_path: Path) -> None:
    api.fail("POST", JOBS, 500, times=100)  # the first leader never gets its Job created
    async with cluster(api, kube_for, tmp_path) as c:
        await eventually(lambda: c.state() == "resetting", 15, "the attempt recorded")
        assert c.jobs() == []
        c.replica.stop()  # killed before its retry
        api.clear_faults()

        async with controllers(kube_for, controller_config(), "ctl2"):
            await eventually(lambda: c.agent.verdict() == "PASS" and c.state() == "", 60,
                             "repaired by the next leader")
            await eventually(lambda: c.events("RepairSucceeded"), 5, "the Event")

        assert c.kubelet.jobs_seen == [f"{REPAIR_NS}/healthd-gpu-reset-{NODE}-1"]
        doc = c.repair()
        assert doc is not None
        assert [(a["remedy"], a["outcome"]) for a in doc["attempts"]] == [("reset", "passed")]
        assert len(c.events("GPUReset")) == 1
        assert len(c.events("RepairSucceeded")) == 1


async def test_a_leader_killed_while_the_job_runs_is_followed_without_a_second_job(
        api: ApiEmulator, kube_for: KubeFactory, tmp_path: Path) -> None:
    async with cluster(api, kube_for, tmp_path) as c:
        c.kubelet.run_delay_s = 2.0  # the reset takes a while
        await eventually(lambda: c.jobs(), 15, "the Job created")
        c.replica.stop()

        async with controllers(kube_for, controller_config(), "ctl2"):
            await eventually(lambda: c.agent.verdict() == "PASS" and c.state() == "", 60,
                             "repaired under the next leader")

        assert len(c.kubelet.jobs_seen) == 1
        doc = c.repair()
        assert doc is not None
        assert [(a["remedy"], a["outcome"]) for a in doc["attempts"]] == [("reset", "passed")]
        assert len(c.events("GPUReset")) == 1


async def test_a_job_removed_after_it_ended_while_no_leader_watched_is_not_run_again(
        api: ApiEmulator, kube_for: KubeFactory, tmp_path: Path) -> None:
    async with cluster(api, kube_for, tmp_path) as c:
        await eventually(lambda: c.jobs(), 15, "the Job created")
        c.replica.stop()
        await eventually(lambda: c.jobs()[0].get("status", {}).get("succeeded") == 1, 60,
                         "the Job done while no leader watches")
        api.remove("Job", c.jobs()[0]["metadata"]["name"], REPAIR_NS)  # its TTL passed
        # ... and no leader came for an hour: the attempt was recorded that long ago.
        node = c.node()
        doc = c.repair()
        assert doc is not None and doc["state"] == "resetting"
        hour_ago = rfc3339(time.time() - 3600)
        node["metadata"]["annotations"][REPAIR] = json.dumps(
            {**doc, "since": hour_ago, "started": hour_ago})
        api.put(node)

        async with controllers(kube_for, controller_config(), "ctl2"):
            await eventually(lambda: c.agent.verdict() == "PASS" and c.state() == "", 60,
                             "validated by the next leader")

        assert len(c.kubelet.jobs_seen) == 1  # the GPUs were reset once
        assert c.jobs() == []
        doc = c.repair()
        assert doc is not None
        assert [(a["remedy"], a["outcome"]) for a in doc["attempts"]] == [("reset", "passed")]
        (said,) = c.events("RepairValidating")
        assert "ended and was removed" in said["message"]
