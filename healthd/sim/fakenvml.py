"""A fake NVML library installed underneath the real `pynvml` (nvidia-ml-py).

`install(spec)` puts a `FakeNvmlLibrary` where pynvml keeps the loaded C library
(`pynvml.nvmlLib`) and clears pynvml's function-pointer cache. From then on every
pynvml call runs pynvml's own code: it looks the symbol up by name on the fake,
passes the same ctypes arguments the C library would get and maps the returned NVML
code to its exception class. Only the innermost edge is fake, so the code under test
is the code that runs on a real GPU node.

- Symbols the fake does not implement (healthd.sim.nvmlsymbols lists those it does)
  raise AttributeError, which pynvml reports as `NVMLError_FunctionNotFound`, like
  an old driver.
- The machine spec (healthd.sim.machine) says what each GPU is and which faults it
  has when; healthd.sim.gpustate merges them for the injectable clock's "now".
- `driver_present: false`: `nvmlInit` fails with `NVMLError_LibraryNotFound`.
- Calls before `nvmlInit` (or after the last `nvmlShutdown`) return UNINITIALIZED.
  On a machine shared between processes (healthd.sim.shared) the session, from the
  first `nvmlInit` to the last `nvmlShutdown`, is registered as a holder of every GPU
  (healthd.sim.holders): a GPU reset is refused meanwhile, as on a real node.
- Persistence mode is live state: `gpus.persistence_mode` at boot and after a reboot,
  changed by `nvmlDeviceSetPersistenceMode`, which on a shared machine goes through
  its control file (`publish`) so every process there sees the change.
  What the process holds (sessions open, nvmlInit calls ever, event sets) is recorded
  at each change (healthd.sim.holders.NvmlSessions: seen from outside the process).
- A lost GPU is still counted, but answers GPU_IS_LOST to every query and to handle
  lookups (what `nvidia-smi` shows as "Unable to determine the device handle for
  GPU ...: GPU is lost"); a handle obtained before the loss stays valid and gets
  GPU_IS_LOST too. A missing GPU is not enumerated: the GPUs after it move down one
  NVML index, as on a real node.
- Injected `nvml_errors` fire before anything else on the named function (its
  `_vN` suffix may be left out); on functions that take no GPU (system queries,
  `nvmlInit`, event sets) they fire whichever GPU the fault names.

Usage::

    with install(load_machine_spec("remap-pending")) as fake:
        pynvml.nvmlInit()
        ...
        fake.emit_xid(5, 79)

XID events are delivered as the real library delivers them: once, to the event sets
registered for them when they fire (healthd.sim.nvmlevents). The XID wait
(`nvmlEventSetWait_v2`) blocks in its caller's thread while other threads keep
calling; one condition variable guards all state. Whatever can hand a waiter an event
or a new XID to sleep until notifies it (`emit_xid`, injected faults, registration,
freeing the set), so a wait sleeps until then, the timeout, or the next XID the spec
schedules. Only that last one depends on the clock: on the real-time clock the wait
sleeps until it is due; on an injected clock (a test stepping time) it looks again
every `_STEP_POLL_S`, and only while such an XID is pending.
"""

from __future__ import annotations

import itertools
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import suppress
from types import TracebackType
from typing import Any

import pynvml

from healthd.sim.gpustate import GpuState, gpu_state, is_active
from healthd.sim.holders import NvmlSessions, Sessions
from healthd.sim.machine import GpuFault, MachineSpec
from healthd.sim.nvmlevents import Delivered, EventSet, ScheduledXid
from healthd.sim.nvmlsymbols import SUCCESS, SYMBOLS, Fail, Impl, address, code, set_pointer
from healthd.sim.repairs import after_reboot, after_reset, resettable

Clock = Callable[[], float]
_HANDLE_BASE = 0x7E57_0000  # fake device "pointers": never dereferenced, only compared
_HANDLE_STEP = 0x100
_EVENT_SET_BASE = 0x7E5E_0000
_VERSION_SUFFIX = re.compile(r"_v\d+$")
# An injected clock may be stepped without telling anyone: while a scheduled XID is
# pending, a wait looks at it this often (never on the real-time clock).
_STEP_POLL_S = 0.005


class FakeNvmlLibrary:
    """The object pynvml believes is libnvidia-ml.so. Attribute lookup returns the
    fake C functions; see the module docstring for the rules it follows."""

    def __init__(self, spec: MachineSpec, clock: Clock,
                 sessions: NvmlSessions | None = None) -> None:
        self.spec = spec
        self.clock = clock
        self.driver_present = spec.driver_present
        self.refcount = 0  # nvmlInit calls not yet matched by nvmlShutdown
        self.registry = sessions  # where this process's NVML session is registered
        self.persistence = self._boot_persistence()
        # Sends a machine change (a control-file command) to every process on the
        # machine, this one first; None: the machine is this process's alone.
        self.publish: Callable[[dict[str, Any]], None] | None = None
        self.inits = 0  # nvmlInit calls that succeeded, ever
        self.event_sets: dict[int, EventSet] = {}
        self.calls: dict[str, int] = {}  # symbol -> times called (for tests and benchmarks)
        self._cond = threading.Condition(threading.RLock())
        self._seq = itertools.count()
        self._faults: list[tuple[int, GpuFault]] = [(next(self._seq), f) for f in spec.faults]
        self._injected_at: dict[int, float] = {}  # a fault added at run time: when
        self._error_budget: dict[tuple[int, int], int] = {}
        self._set_numbers = itertools.count(1)
        self._healthy: dict[int, GpuState] = {}
        self.responding = threading.Event()  # cleared: device queries hang, as on a wedged driver
        self.responding.set()

    # -- pynvml's view: symbols looked up by name --------------------------------

    def __getattr__(self, name: str) -> Callable[..., Any]:
        entry = SYMBOLS.get(name)
        if entry is None:
            raise AttributeError(name)  # pynvml: NVMLError_FunctionNotFound
        kind, impl = entry

        def c_function(*args: Any) -> Any:
            return self._invoke(name, kind, impl, args)

        c_function.__name__ = name
        return c_function

    def _invoke(self, name: str, kind: str, impl: Impl, args: tuple[Any, ...]) -> Any:
        if kind in ("device", "change"):
            self.responding.wait()
        if kind == "change":
            return self._change(name, impl, args)
        with self._cond:
            self.calls[name] = self.calls.get(name, 0) + 1
            try:
                if kind != "raw":
                    self._check_ready(name, inject=kind == "system")
                if kind == "device":
                    return impl(self, self.gate(name, self._gpu_of_handle(args[0])),
                                *args[1:]) or SUCCESS
                result = impl(self, *args)
                return SUCCESS if result is None else result
            except Fail as failure:
                return failure.code

    def _change(self, name: str, impl: Impl, args: tuple[Any, ...]) -> Any:
        """A device call that changes the machine: checked under the lock, made outside
        it, since publishing takes the control file's lock, whose follower applies
        other processes' changes under this one."""
        try:
            with self._cond:
                self.calls[name] = self.calls.get(name, 0) + 1
                self._check_ready(name, inject=False)
                state = self.gate(name, self._gpu_of_handle(args[0]))
            return impl(self, state, *args[1:]) or SUCCESS
        except Fail as failure:
            return failure.code

    def _check_ready(self, name: str, *, inject: bool) -> None:
        if not self.driver_present or self.refcount == 0:
            raise Fail(code("UNINITIALIZED"))
        if inject:
            self.raise_injected(name, None)

    def gate(self, name: str, gpu: int) -> GpuState:
        """The GPU's state for a call about it, after injected errors and loss."""
        self.raise_injected(name, gpu)
        state = self.state(gpu)
        if state.missing:
            raise Fail(code("INVALID_ARGUMENT"))
        if state.lost:
            raise Fail(code("GPU_IS_LOST"))
        if _VERSION_SUFFIX.sub("", name) in self.spec.gpus.unsupported:
            raise Fail(code("NOT_SUPPORTED"))
        return state

    def raise_injected(self, name: str, gpu: int | None) -> None:
        """Fire an injected error for `name` on `gpu` (None: a call that takes no GPU,
        so faults on any GPU apply)."""
        base = _VERSION_SUFFIX.sub("", name)
        now = self.clock()
        for seq, fault in self._faults:
            if (gpu is not None and fault.gpu != gpu) or not is_active(fault, now):
                continue
            for pos, err in enumerate(fault.nvml_errors):
                if err.function in (name, base) and self._spend(seq, pos, err.times):
                    raise Fail(code(err.error))

    def _spend(self, seq: int, pos: int, times: int | None) -> bool:
        if times is None:
            return True
        left = self._error_budget.setdefault((seq, pos), times)
        self._error_budget[(seq, pos)] = left - 1
        return left > 0

    # -- GPUs ---------------------------------------------------------------------

    @property
    def lock(self) -> threading.Condition:
        return self._cond

    def faults_for(self, gpu: int) -> list[GpuFault]:
        with self._cond:
            return [f for _, f in self._faults if f.gpu == gpu]

    def state(self, gpu: int) -> GpuState:
        """GPU `gpu` (spec index) as it is now."""
        faults = self.faults_for(gpu)
        if not faults:  # the common case, served without rebuilding the state
            if gpu not in self._healthy:
                self._healthy[gpu] = gpu_state(self.spec, (), gpu, 0.0)
            return self._healthy[gpu]
        return gpu_state(self.spec, faults, gpu, self.clock())

    def enumerated(self) -> list[GpuState]:
        """The GPUs NVML lists now, in NVML index order (missing ones left out)."""
        states = (self.state(i) for i in range(self.spec.gpus.count))
        return [s for s in states if not s.missing]

    def handle_of(self, gpu: int) -> int:
        return _HANDLE_BASE + (gpu + 1) * _HANDLE_STEP

    def _gpu_of_handle(self, handle: Any) -> int:
        gpu, rest = divmod(address(handle) - _HANDLE_BASE, _HANDLE_STEP)
        if rest or not 1 <= gpu <= self.spec.gpus.count:
            raise Fail(code("INVALID_ARGUMENT"))
        return gpu - 1

    def found(self, name: str, state: GpuState | None, out: Any) -> int:
        """Finish a handle lookup: write the handle, or fail as the GPU would."""
        if state is None:
            raise Fail(code("NOT_FOUND"))
        self.gate(name, state.index)
        set_pointer(out, self.handle_of(state.index))
        return SUCCESS

    # -- event sets (called with the lock held) ------------------------------------

    def new_event_set_handle(self) -> int:
        return _EVENT_SET_BASE + next(self._set_numbers) * 0x10

    def event_set(self, handle: Any) -> EventSet:
        event_set = self.event_sets.get(address(handle))
        if event_set is None:
            raise Fail(code("INVALID_ARGUMENT"))
        return event_set

    def wait_event(self, handle: Any, timeout_s: float) -> Delivered | None:
        """Block (releasing the lock) until the set has an event or the timeout ends."""
        deadline = time.monotonic() + timeout_s
        while True:
            event_set = self.event_set(handle)  # freed meanwhile: INVALID_ARGUMENT
            now = self.clock()
            event_set.collect_due(self._scheduled_xids(), now)
            event = event_set.next_event()
            left = deadline - time.monotonic()
            if event is not None or left <= 0:
                return event
            self._cond.wait(min(left, self._until_next_xid(event_set, now)))

    def _until_next_xid(self, event_set: EventSet, now: float) -> float:
        """How long a wait on `event_set` may sleep before a scheduled XID falls due
        (infinite when none is pending); see the module docstring."""
        pending = event_set.next_due(self._scheduled_xids())
        if pending is None:
            return float("inf")
        if isinstance(self.clock, MonotonicClock):
            return max(0.0, pending - now)
        return _STEP_POLL_S

    def wake(self) -> None:
        self._cond.notify_all()

    def sessions(self) -> Sessions:
        """What this process holds of NVML now."""
        with self._cond:
            return Sessions(self.refcount, self.inits, len(self.event_sets))

    def sessions_changed(self) -> None:
        """Record what this process holds now on its machine (called with the lock
        held)."""
        if self.registry is not None:
            self.registry.record(self.sessions())

    def _scheduled_xids(self) -> Iterator[ScheduledXid]:
        """Every XID the faults schedule, except those of an injected fault that were
        already due when it was injected (they fired then, see `add_fault`)."""
        for seq, fault in self._faults:
            injected = self._injected_at.get(seq, -1.0)
            for pos, xid in enumerate(fault.xid):
                if xid.at > injected:
                    yield ScheduledXid((seq, pos), fault.gpu, xid.code, xid.at)

    # -- NVML sessions and persistence mode -------------------------------------------

    def session_changed(self, refcount: int) -> None:
        """The count of open nvmlInit calls is now `refcount`: a session begins at the
        first, ends at the last shutdown (or when the driver goes)."""
        ended = self.refcount > 0 and refcount == 0
        self.refcount = refcount
        if ended:
            self.event_sets.clear()

    def _boot_persistence(self) -> dict[int, bool]:
        return dict.fromkeys(range(self.spec.gpus.count), self.spec.gpus.persistence_mode)

    def set_persistence(self, gpu: int | None, enabled: bool) -> None:
        """Persistence mode of `gpu` (None: every GPU) on or off, in this process."""
        with self._cond:
            for index in self.persistence if gpu is None else [gpu]:
                self.persistence[index] = enabled

    # -- runtime control (through FakeNvml) ----------------------------------------

    def add_fault(self, fault: GpuFault) -> None:
        """A fault from now on. It cannot have fired XIDs before it existed: those it
        schedules at or before now fire now, like `emit_xid`."""
        with self._cond:
            seq, now = next(self._seq), self.clock()
            self._injected_at[seq] = now
            self._faults.append((seq, fault))
            for xid in fault.xid:
                if xid.at <= now:
                    self._fire(fault.gpu, xid.code)
            self._cond.notify_all()

    def clear_faults(self, gpu: int | None) -> None:
        with self._cond:
            self._faults = [(s, f) for s, f in self._faults if gpu is not None and f.gpu != gpu]
            kept = {seq for seq, _ in self._faults}
            self._injected_at = {s: t for s, t in self._injected_at.items() if s in kept}
            self._cond.notify_all()

    def emit_xid(self, gpu: int, xid: int) -> None:
        with self._cond:
            self._fire(gpu, xid)
            self._cond.notify_all()

    def reset_gpu(self, gpu: int) -> bool:
        """A GPU reset of `gpu` now (healthd.sim.repairs); False when the reset cannot
        reach it (lost from the bus, not enumerated): nothing changes then."""
        with self._cond:
            now = self.clock()
            active = [(s, f) for s, f in self._faults if f.gpu == gpu and is_active(f, now)]
            if not all(resettable(f) for _, f in active):
                return False
            reset = {s: after_reset(f) for s, f in active}
            self._faults = [(s, reset.get(s, f)) for s, f in self._faults]
            self._cond.notify_all()
            return True

    def reboot(self) -> None:
        """The node rebooted: the driver starts again, with no session and no event set,
        and every fault in force keeps only what survives a reboot (healthd.sim.repairs)."""
        with self._cond:
            now = self.clock()
            kept: list[tuple[int, GpuFault]] = []
            for seq, fault in self._faults:
                after = after_reboot(fault) if is_active(fault, now) else fault
                if after is not None:
                    kept.append((seq, after))
            self._faults = kept
            seqs = {seq for seq, _ in kept}
            self._injected_at = {s: t for s, t in self._injected_at.items() if s in seqs}
            self.session_changed(0)
            self.event_sets.clear()
            self.persistence = self._boot_persistence()
            self.sessions_changed()
            self._cond.notify_all()

    def _fire(self, gpu: int, xid: int) -> None:
        """XID `xid` on `gpu` now, to the event sets registered at this moment, each
        after the scheduled XIDs that fired before it (a set reads them in order)."""
        now, scheduled = self.clock(), list(self._scheduled_xids())
        for event_set in self.event_sets.values():
            event_set.collect_due(scheduled, now)
            event_set.fire(gpu, xid)

    def set_driver_present(self, present: bool) -> None:
        with self._cond:
            self.driver_present = present
            if not present:  # the driver went away: every session is gone with it
                self.session_changed(0)
                self.event_sets.clear()
                self.sessions_changed()
            self._cond.notify_all()


class FakeNvml:
    """An installed fake: change the simulated machine at run time, then uninstall
    (also as a context manager). GPU numbers are positions in the spec."""

    def __init__(self, library: FakeNvmlLibrary, previous: tuple[Any, dict[str, Any], int]) -> None:
        self.library = library
        self._previous = previous
        self._installed = True

    @property
    def spec(self) -> MachineSpec:
        return self.library.spec

    @property
    def clock(self) -> Clock:
        """The machine's clock (share it with other simulated parts, e.g. CUDA)."""
        return self.library.clock

    def now(self) -> float:
        """Seconds since the machine started, by the injected clock."""
        return self.library.clock()

    def faults_for(self, gpu: int) -> list[GpuFault]:
        """The faults on `gpu` now: the spec's plus injected ones, minus cleared ones."""
        return self.library.faults_for(gpu)

    def state(self, gpu: int) -> GpuState:
        """What the fake serves about `gpu` (spec index) at this moment."""
        with self.library.lock:
            return self.library.state(gpu)

    def sessions(self) -> Sessions:
        """What this process holds of NVML now: sessions open, nvmlInit calls ever,
        event sets (healthd.sim.holders.Sessions)."""
        return self.library.sessions()

    def inject(self, fault: GpuFault) -> None:
        """Add a fault (with its own `at`/`until`, measured from machine start; its XIDs
        due already fire now)."""
        # Validate against the machine (GPU and link numbers, capabilities).
        MachineSpec.model_validate({**self.spec.model_dump(), "faults": [fault.model_dump()]})
        self.library.add_fault(fault)

    def clear_faults(self, gpu: int | None = None) -> None:
        """Remove every fault (the spec's too), or those of one GPU."""
        self.library.clear_faults(gpu)

    def emit_xid(self, gpu: int, xid: int) -> None:
        """Fire XID `xid` on `gpu` now: every event set registered for XIDs on it gets it
        once; a set registered later never does."""
        if not 0 <= gpu < self.spec.gpus.count:
            raise ValueError(f"no gpu {gpu}: the machine has {self.spec.gpus.count}")
        self.library.emit_xid(gpu, xid)

    def set_driver_present(self, present: bool) -> None:
        """Load or unload the simulated driver (unloading ends every NVML session)."""
        self.library.set_driver_present(present)

    def reset_gpu(self, gpu: int) -> bool:
        """Reset GPU `gpu` as `nvidia-smi --gpu-reset` would; False when the reset
        cannot reach it (healthd.sim.repairs)."""
        if not 0 <= gpu < self.spec.gpus.count:
            raise ValueError(f"no gpu {gpu}: the machine has {self.spec.gpus.count}")
        return self.library.reset_gpu(gpu)

    def reboot(self) -> None:
        """Reboot the machine's GPUs: what survives a reboot stays (healthd.sim.repairs)."""
        self.library.reboot()

    def persistence(self, gpu: int) -> bool:
        """Whether `gpu` is in persistence mode now."""
        with self.library.lock:
            return self.library.persistence[gpu]

    def set_persistence(self, gpu: int | None, enabled: bool) -> None:
        """Persistence mode of `gpu` (None: every GPU) on or off, in this process (the
        control file's `persistence` line does it for every process on the machine)."""
        if gpu is not None and not 0 <= gpu < self.spec.gpus.count:
            raise ValueError(f"no gpu {gpu}: the machine has {self.spec.gpus.count}")
        self.library.set_persistence(gpu, enabled)

    def hang(self) -> None:
        """Device queries block until `respond()`, as NVML does on a wedged driver: the
        calling thread cannot be interrupted, so the round it belongs to never ends."""
        self.library.responding.clear()

    def respond(self) -> None:
        """End `hang()`: blocked queries go on."""
        self.library.responding.set()

    def uninstall(self) -> None:
        """Shut NVML down and put back whatever library pynvml had before."""
        self.respond()
        if not self._installed:
            return
        self._installed = False
        with suppress(pynvml.NVMLError):
            while self.library.refcount > 0 and pynvml.nvmlLib is self.library:
                pynvml.nvmlShutdown()
        with self.library.lock:  # no session outlives the library (pynvml has another)
            self.library.session_changed(0)
        lib, cache, refcount = self._previous
        with pynvml.libLoadLock:
            pynvml.nvmlLib = lib
            pynvml._nvmlGetFunctionPointer_cache.clear()
            pynvml._nvmlGetFunctionPointer_cache.update(cache)
            pynvml._nvmlLib_refcount = refcount

    def __enter__(self) -> FakeNvml:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.uninstall()


class MonotonicClock:
    """Seconds since the machine started, in real time: `elapsed` at construction (0:
    the machine starts now). The default machine clock; waits can sleep until a
    scheduled XID on it without looking at it again."""

    def __init__(self, elapsed: float = 0.0) -> None:
        self._start = time.monotonic() - max(0.0, elapsed)

    def __call__(self) -> float:
        return time.monotonic() - self._start


def monotonic_clock(elapsed: float = 0.0) -> Clock:
    """A clock reading seconds since the machine started, `elapsed` seconds ago (0:
    the machine starts with this call)."""
    return MonotonicClock(elapsed)


def install(spec: MachineSpec, *, clock: Clock | None = None,
            sessions: NvmlSessions | None = None) -> FakeNvml:
    """Install a fake NVML library serving `spec` underneath pynvml. `clock` returns
    seconds since the machine started (default: real time from now); `sessions`: where
    a shared machine registers this process's NVML session. NVML is not initialised:
    callers call `pynvml.nvmlInit()` as they would on a real node."""
    library = FakeNvmlLibrary(spec, clock or monotonic_clock(), sessions)
    with pynvml.libLoadLock:
        previous = (pynvml.nvmlLib, dict(pynvml._nvmlGetFunctionPointer_cache),
                    pynvml._nvmlLib_refcount)
        pynvml.nvmlLib = library
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlLib_refcount = 0
    return FakeNvml(library, previous)
