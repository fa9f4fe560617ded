"""Letting go of NVML while the controller resets the node's GPUs.

`nvidia-smi --gpu-reset` refuses a GPU that any NVML client holds, and the agent holds
every GPU of its node: an NVML session and an XID event set, which belong to the
process (only freeing the set and nvmlShutdown let go). So while the node's repair
record (`healthd.io/repair`, the controller's) says `resetting`, the agent lets go:

- the NVML reader is released (checks.nvml_reader: the one gate): the event set is
  freed and the session ended once the XID wait and the pciebw copy in flight end;
  until the record leaves `resetting` nothing opens NVML again. The NVML checks are
  UNKNOWN (`RELEASED`), which holds and releases nothing; the XID waiter finds no
  events; pciebw starts no probe. The node shows TESTING meanwhile (the repair's own
  rule, healthd.agent.health);
- once the session has ended, the Node says so: `healthd.io/nvml-released` = the
  record's `job` (namespace/name of the GPU-reset Job), written by the one Node writer
  with the rest of the agent's state, so the controller can create the Job after it;
- when the record leaves `resetting` (validating, idle, anything else, a record that
  cannot be read), the annotation goes in the next write and NVML is opened again
  at once, with a new XID event set, so no XID from then on is missed. XIDs logged
  meanwhile are the kernel log's, which the xid check reads on its next run.

Before the agent has read its Node, NVML stays shut as well (`NOT_READ`): an agent
started during a reset (a rollout, an OOM kill) must not take the GPUs back before it
knows, and a killed agent's session is gone with its process. The key is left as the
Node shows it until the first copy has been acted on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import anyio

from checks.snapshot import NvmlGpuSource
from healthd.published import Repair, Undecodable

log = logging.getLogger(__name__)

RELEASED = "NVML released for a GPU reset"
NOT_READ = "NVML not opened before the agent has read its Node (a GPU reset may be under way)"


def released_for(repair: Repair | Undecodable | None) -> str | None:
    """The GPU-reset Job (namespace/name; "" when the record names none) the record
    asks the agent to let go of NVML for, or None when it asks nothing: no record,
    one that cannot be read, or any state but `resetting`."""
    if isinstance(repair, Repair) and repair.resetting:
        return repair.job
    return None


class NvmlRelease:
    """Keeps the agent's hold on NVML in step with the repair record (see the module
    docstring). `observe` takes each copy's record; `run` acts on it and tells
    `on_change` the Job NVML was let go for (None: NVML is in use again)."""

    def __init__(self, gpus: NvmlGpuSource, *,
                 on_change: Callable[[str | None], None]) -> None:
        self._gpus, self._on_change = gpus, on_change
        self._wanted: str | None = None  # what the latest record asks
        self._job: str | None = None  # what NVML's state follows now
        self._changed = anyio.Event()
        self.decided = anyio.Event()  # set once the first copy of the Node is acted on

    def observe(self, repair: Repair | Undecodable | None) -> None:
        """The repair record of a new copy of the Node."""
        self._wanted = released_for(repair)
        self._changed.set()

    async def run(self) -> None:
        """Release or resume NVML as the latest record asks; runs until cancelled."""
        while True:
            await self._changed.wait()
            self._changed = anyio.Event()
            wanted = self._wanted
            if not self.decided.is_set() or wanted != self._job:
                await self._follow(wanted)

    async def _follow(self, job: str | None) -> None:
        """Let go of NVML for `job`, or take it up again (None); then say so."""
        if job is None:
            await self._gpus.resume()
            if self._job is not None:
                log.info("NVML in use again: the repair record left resetting")
        else:
            await self._gpus.release(RELEASED)
            log.info("NVML released for GPU-reset Job %s", job or "(not named)")
        self._job = job
        self._on_change(job)
        self.decided.set()
