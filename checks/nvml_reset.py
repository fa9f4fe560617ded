"""What a GPU reset asks of NVML, through the real `pynvml`: find a GPU by UUID, what
it says of the GPU's holders (its processes, persistence mode, its minor number for
the device file), turn persistence mode off and on (what `nvidia-smi -pm` does), and,
after the reset, whether the GPU answers with the same UUID.

With checks.nvml_reader the only code outside the simulator that imports pynvml. A
session (`NvmlGpus.session`) is opened only while it is needed: an NVML session keeps
every GPU's device files open, and the driver refuses to reset a GPU any client
holds, this one included. Every lookup takes a fresh handle: after persistence mode
is turned off a GPU's old handle may be invalid (coherent NVLink to system memory,
as on Grace Hopper, says NVML's documentation). No call raises an NVML error: each
answers what went wrong as text, naming the function.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any, TypeVar

import pynvml

T = TypeVar("T")


class NvmlUnavailable(Exception):
    """NVML cannot be initialised (no driver, a broken library)."""


class _Failed(Exception):
    """One NVML call failed; the message names it."""


@dataclass(frozen=True)
class GpuView:
    """One GPU as NVML shows it before a reset."""

    uuid: str
    minor: int | None = None  # its device file is /dev/nvidia<minor>; None: unknown
    persistence: bool | None = None  # None: could not be read
    processes: tuple[tuple[int, str], ...] = ()  # (pid, "compute" or "graphics")
    problem: str = ""  # what could not be read; "" when everything was
    together: str = ""  # why it resets only with every GPU of the board; "": alone


def _call(fn: Callable[..., T], *args: Any) -> T:
    name = getattr(fn, "__name__", "nvml")
    try:
        return fn(*args)
    except pynvml.NVMLError as exc:
        raise _Failed(f"{name}: {exc}") from exc
    except Exception as exc:  # a binding or ctypes surprise is a failed call too
        raise _Failed(f"{name}: {type(exc).__name__}: {exc}") from exc


def _handle(uuid: str) -> Any:
    return _call(pynvml.nvmlDeviceGetHandleByUUID, uuid)


class NvmlGpus:
    """The reset's NVML calls, by GPU UUID."""

    @contextmanager
    def session(self) -> Iterator[None]:
        """NVML initialised for the block, shut down after (NvmlUnavailable if it
        cannot be initialised)."""
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NvmlUnavailable(f"nvmlInit: {exc}") from exc
        except Exception as exc:
            raise NvmlUnavailable(f"nvmlInit: {type(exc).__name__}: {exc}") from exc
        try:
            yield
        finally:
            with suppress(pynvml.NVMLError):
                pynvml.nvmlShutdown()

    def view(self, uuid: str) -> GpuView:
        """The GPU `uuid`: what of it NVML can tell (`problem` says what it cannot)."""
        try:
            handle = _handle(uuid)
        except _Failed as exc:
            return GpuView(uuid, problem=str(exc))
        problems: list[str] = []
        minor = _optional(problems, pynvml.nvmlDeviceGetMinorNumber, handle)
        mode = _optional(problems, pynvml.nvmlDeviceGetPersistenceMode, handle)
        processes: list[tuple[int, str]] = []
        for kind, listing in (("compute", pynvml.nvmlDeviceGetComputeRunningProcesses),
                              ("graphics", pynvml.nvmlDeviceGetGraphicsRunningProcesses)):
            found = _optional(problems, listing, handle) or []
            processes += [(int(p.pid), kind) for p in found]
        persistence = None if mode is None else mode == pynvml.NVML_FEATURE_ENABLED
        return GpuView(uuid, None if minor is None else int(minor), persistence,
                       tuple(processes), "; ".join(problems), _together(handle))

    def board(self) -> list[str]:
        """The UUIDs of every GPU NVML sees (what a reset of the whole board resets);
        [] when they cannot be listed."""
        try:
            count = int(_call(pynvml.nvmlDeviceGetCount))
            return [str(_call(pynvml.nvmlDeviceGetUUID,
                              _call(pynvml.nvmlDeviceGetHandleByIndex, i)))
                    for i in range(count)]
        except _Failed:
            return []

    def set_persistence(self, uuid: str, enabled: bool) -> str:
        """Turn the GPU's persistence mode on or off: "" when done, else why not."""
        mode = pynvml.NVML_FEATURE_ENABLED if enabled else pynvml.NVML_FEATURE_DISABLED
        try:
            _call(pynvml.nvmlDeviceSetPersistenceMode, _handle(uuid), mode)
        except _Failed as exc:
            return str(exc)
        return ""

    def answers(self, uuid: str) -> str:
        """"" when the GPU answers NVML with the UUID `uuid`; else what it answered."""
        try:
            found = str(_call(pynvml.nvmlDeviceGetUUID, _handle(uuid)))
        except _Failed as exc:
            return str(exc)
        return "" if found == uuid else f"nvmlDeviceGetUUID: {found}, not {uuid}"


def _together(handle: Any) -> str:
    """Why the GPU can be reset only together with the board's other GPUs ("": alone,
    or NVML cannot say, and nvidia-smi decides): from Hopper on, every GPU resets
    alone; an Ampere GPU on NVSwitches (A100 HGX) resets with every GPU and the
    switches; before Ampere, GPUs joined by NVLink reset together."""
    try:
        arch = int(_call(pynvml.nvmlDeviceGetArchitecture, handle))
    except _Failed:
        return ""
    if arch >= pynvml.NVML_DEVICE_ARCH_HOPPER or arch == pynvml.NVML_DEVICE_ARCH_UNKNOWN:
        return ""
    links = _links(handle)
    if arch == pynvml.NVML_DEVICE_ARCH_AMPERE:
        switched = any(_quiet(pynvml.nvmlDeviceGetNvLinkRemoteDeviceType, handle, link)
                       == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH for link in links)
        return "an Ampere GPU on NVSwitches resets only with every GPU of the board" \
            if switched else ""
    return "a GPU joined by NVLink before Ampere resets only with the GPUs it is joined " \
        "to" if links else ""


def _links(handle: Any) -> list[int]:
    """The NVLinks the GPU has (up or down), by number."""
    found = []
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        if _quiet(pynvml.nvmlDeviceGetNvLinkState, handle, link) is None:
            break
        found.append(link)
    return found


def _quiet(fn: Callable[..., T], *args: Any) -> T | None:
    """`fn(*args)`, or None when it fails."""
    try:
        return _call(fn, *args)
    except _Failed:
        return None


def _optional(problems: list[str], fn: Callable[..., T], *args: Any) -> T | None:
    """`fn(*args)`, or None with the failure added to `problems`."""
    try:
        return _call(fn, *args)
    except _Failed as exc:
        problems.append(str(exc))
        return None
