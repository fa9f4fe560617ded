"""Several simulated GPU nodes in one process, each with its own fake NVML library.

pynvml keeps one loaded library per process (`pynvml.nvmlLib`), so
`healthd.sim.node.simulate` serves one machine at a time. The demo and benchmarks
run one real agent per simulated node in one process; `simulate_nodes` installs a
dispatcher in pynvml's place that forwards every C call to the library of the node
whose code is calling. Which node that is travels in a context variable:
`bound(node)` sets it, every task started under it inherits it, and anyio copies it
into the worker threads that make the blocking NVML calls. Each node keeps its own
machine clock, faults, XID event sets and NVML session, exactly as with one node.

Each node's machine is also the one a control file names (healthd.sim.shared), so a
process started for that node (the GPU-reset Job's `healthd gpu-reset --sim-control
FILE` the fake kubelet runs) works on the same machine: what it changes there (a GPU
reset) reaches the node's agent here, and what is changed here through `change` (a
fault, a repair) is what it finds there.

Usage::

    with simulate_nodes({"n1": spec1, "n2": spec2}) as fleet:
        async with anyio.create_task_group() as tg:
            for name, sim in fleet.nodes.items():
                tg.start_soon(fleet.run_bound, name, Agent(sim.adapt(config), node=name,
                                                       probes=sim.probes()).run)
        fleet.change("n2", {"op": "emit_xid", "gpu": 3, "code": 79})
"""

from __future__ import annotations

import tempfile
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml

from healthd.sim.control import Command, ControlFile
from healthd.sim.cuda import SimBandwidthProbe
from healthd.sim.fakenvml import FakeNvml, FakeNvmlLibrary, install, monotonic_clock
from healthd.sim.holders import NvmlSessions
from healthd.sim.machine import MachineSpec
from healthd.sim.network import SimNetwork
from healthd.sim.node import SimulatedNode
from healthd.sim.nvmlsymbols import SYMBOLS
from healthd.sim.shared import shared_machine

_current: ContextVar[FakeNvmlLibrary | None] = ContextVar("healthd_sim_node", default=None)
_UNUSED_PREVIOUS: tuple[Any, dict[str, Any], int] = (None, {}, 0)  # never uninstalled


class _Dispatcher:
    """What pynvml believes is the C library: each symbol forwards to the library of
    the calling node (the first node's when no node is bound, e.g. error strings)."""

    def __init__(self, default: FakeNvmlLibrary) -> None:
        self._default = default

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name not in SYMBOLS:
            raise AttributeError(name)  # pynvml: NVMLError_FunctionNotFound

        def c_function(*args: Any) -> Any:
            library = _current.get() or self._default
            return getattr(library, name)(*args)

        c_function.__name__ = name
        return c_function


@dataclass
class SimulatedNodes:
    """The installed fleet: one `SimulatedNode` per node name, each on the machine its
    control file names (`SimulatedNode.control`); `change` changes one."""

    nodes: dict[str, SimulatedNode]
    network: SimNetwork  # every node's pod network and net1 links (healthd.sim.network)
    controls: dict[str, ControlFile]

    def change(self, node: str, command: Command) -> None:
        """A control-file command (healthd.sim.control) on `node`'s machine: applied
        now, and seen by every other process on that machine; ValueError for a bad one."""
        self.controls[node].change(command)

    @contextmanager
    def bound(self, node: str) -> Iterator[SimulatedNode]:
        """NVML calls made in this context (and tasks and threads started from it)
        reach `node`'s simulated machine."""
        sim = self.nodes[node]
        token = _current.set(sim.nvml.library)
        try:
            yield sim
        finally:
            _current.reset(token)

    async def run_bound(self, node: str, main: Callable[[], Awaitable[None]]) -> None:
        """Run `main()` (an agent's `run`) bound to `node`."""
        with self.bound(node):
            await main()


def _simulated(library: FakeNvmlLibrary, fake: FakeNvml, network: SimNetwork) -> SimulatedNode:
    probe = SimBandwidthProbe(library.spec, clock=library.clock, faults=fake.faults_for)
    return SimulatedNode(library.spec, fake, probe, network)


@contextmanager
def simulate_nodes(specs: Mapping[str, MachineSpec]) -> Iterator[SimulatedNodes]:
    """Install one simulated machine per node name for the duration of the block
    (each spec's `node` is set to its name). pynvml gets its old library back after."""
    if not specs:
        raise ValueError("simulate_nodes needs at least one node")
    named = {name: spec.model_copy(update={"node": name}) for name, spec in specs.items()}
    with tempfile.TemporaryDirectory(prefix="healthd-sim-") as workdir, ExitStack() as stack:
        controls = {name: Path(workdir) / f"{name}.control" for name in named}
        # Each machine starts with its control file's: one clock for every process on it.
        machines = {name: shared_machine(controls[name], spec) for name, spec in named.items()}
        first_name, *others = named
        first = install(named[first_name], clock=monotonic_clock(
            machines[first_name].elapsed()),  # remembers what pynvml had, to restore it
            sessions=NvmlSessions(machines[first_name].root))
        stack.callback(first.uninstall)
        fakes = {first_name: first}
        for name in others:
            library = FakeNvmlLibrary(named[name], monotonic_clock(machines[name].elapsed()),
                                      NvmlSessions(machines[name].root))
            fakes[name] = FakeNvml(library, _UNUSED_PREVIOUS)
        with pynvml.libLoadLock:
            pynvml.nvmlLib = _Dispatcher(first.library)
            pynvml._nvmlGetFunctionPointer_cache.clear()
        network = SimNetwork(list(named))
        nodes = {name: _simulated(fake.library, fake, network) for name, fake in fakes.items()}
        for name, node in nodes.items():  # each machine's kernel log and sysfs tree
            node.control = controls[name]
            node.control.touch()
            node.start_files(machines[name].root)
        followers = {name: ControlFile(controls[name], node) for name, node in nodes.items()}
        for name, follower in followers.items():
            nodes[name].follow(follower)
            stack.enter_context(follower)
        yield SimulatedNodes(nodes, network, followers)
