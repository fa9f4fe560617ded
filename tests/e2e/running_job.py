"""Two GPU nodes with their agents, the controller, and one AppWrapper of one 8-GPU
pod running on one of them: the start of every test that disturbs the control plane
or the network and then checks that healthd still evicts and resets."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from tests.e2e.healthd import Healthd, eventually
from tests.e2e.mlbatch import Workloads, appwrapper, tutorial


@dataclass
class RunningJob:
    """The AppWrapper `name` running on node `bad`; node `other` healthy beside it."""

    healthd: Healthd
    name: str
    bad: str
    other: str

    @property
    def workloads(self) -> Workloads:
        return Workloads(self.healthd.client)

    def evicted_and_reset(self) -> None:
        """An XID 79 on `bad` turns it EVICT and the job is reset onto `other`."""
        healthd, workloads = self.healthd, self.workloads
        healthd.agents[self.bad].fault(op="emit_xid", gpu=2, code=79)
        eventually(lambda: healthd.label(self.bad) == "EVICT", 60, f"EVICT on {self.bad}")
        eventually(lambda: workloads.running_nodes("blue", self.name) == [self.other]
                   and workloads.phase("blue", self.name) == "Running", 120,
                   "the job reset and running on the healthy node")
        assert healthd.label(self.other) == "PASS"
        healthd.applier.delete([appwrapper(self.name, "blue", pods=1, gpus_per_pod=8)])


def running_job(healthd: Healthd, tag: str, *, server: str | None = None) -> RunningJob:
    """Set it all up (agents and controller talking to `server` when given) and wait
    until the job runs."""
    workloads = Workloads(healthd.client)
    healthd.applier.apply(tutorial())
    nodes = healthd.start_fleet(tag, 2, server=server)
    name = f"job-{uuid.uuid4().hex[:5]}"
    healthd.applier.apply([appwrapper(name, "blue", pods=1, gpus_per_pod=8)])
    eventually(lambda: len(workloads.running_nodes("blue", name)) == 1
               and workloads.phase("blue", name) == "Running", 120, "the job Running")
    bad = workloads.running_nodes("blue", name)[0]
    return RunningJob(healthd, name, bad, next(n for n in nodes if n != bad))
