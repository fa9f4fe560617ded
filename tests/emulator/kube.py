"""`Kube`: one official-client flavour (sync or `kubernetes.aio`) against one target.

Contract tests call `await kube.call("CoreV1Api", "read_node", name)` and get the
same behaviour from both flavours: the sync client runs in a worker thread so the
emulator keeps serving on the test's loop. Against the real API server (a kubeconfig)
the same calls go there; `kube.emulator` is None then.
"""

from __future__ import annotations

import contextlib
import functools
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import kubernetes.aio.client as aio_client
import kubernetes.aio.config as aio_config
import kubernetes.aio.watch as aio_watch
import kubernetes.client as sync_client
import kubernetes.config as sync_config
import kubernetes.watch as sync_watch

from healthd.sim.apiserver import ApiEmulator

Event = dict[str, Any]


class Kube:
    """Uniform calls, errors and watches over the sync or async client."""

    def __init__(self, flavor: str, client: Any, emulator: ApiEmulator | None) -> None:
        self.flavor = flavor
        self.client = client
        self.emulator = emulator
        self.suffix = uuid.uuid4().hex[:6]
        self.namespace = f"emu-{self.suffix}"
        self._cleanups: list[tuple[str, str, tuple[Any, ...]]] = []

    @property
    def is_async(self) -> bool:
        return self.flavor == "async"

    def name(self, base: str) -> str:
        """A name unique to this test (real clusters are shared)."""
        return f"{base}-{self.suffix}"

    def _method(self, api: str, method: str) -> Callable[..., Any]:
        module = aio_client if self.is_async else sync_client
        return getattr(getattr(module, api)(self.client), method)

    async def call(self, api: str, method: str, *args: Any, **kwargs: Any) -> Any:
        fn = self._method(api, method)
        if self.is_async:
            return await fn(*args, **kwargs)
        return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))

    async def error(self, api: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """The ApiException the call raises (fails the test when it succeeds)."""
        err = await self.error_or_none(api, method, *args, **kwargs)
        if err is None:
            raise AssertionError(f"{method} succeeded")
        return err

    async def error_or_none(self, api: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """The ApiException the call raises, or None when it succeeds."""
        exc_type = aio_client.ApiException if self.is_async else sync_client.ApiException
        try:
            await self.call(api, method, *args, **kwargs)
        except exc_type as exc:
            return exc
        return None

    def later(self, api: str, method: str, *args: Any) -> None:
        """Delete something at teardown (cluster-scoped objects on a real cluster)."""
        self._cleanups.append((api, method, args))

    async def cleanup(self) -> None:
        exc_type = aio_client.ApiException if self.is_async else sync_client.ApiException
        for api, method, args in reversed(self._cleanups):
            with contextlib.suppress(exc_type):
                await self.call(api, method, *args)

    async def watch(self, api: str, method: str, *args: Any,
                    until: Callable[[list[Event]], bool] | None = None,
                    **kwargs: Any) -> list[Event]:
        """Events of one watch, until `until(events)` or the stream ends."""
        fn = self._method(api, method)
        if self.is_async:
            events: list[Event] = []
            async with aio_watch.Watch() as watch:
                async for event in watch.stream(fn, *args, **kwargs):
                    events.append(event)
                    if until is not None and until(events):
                        break
            return events

        def run() -> list[Event]:
            out: list[Event] = []
            watch = sync_watch.Watch()
            for event in watch.stream(fn, *args, **kwargs):
                out.append(event)
                if until is not None and until(out):
                    watch.stop()
                    break
            return out

        return await anyio.to_thread.run_sync(run)


def types_of(events: list[Event]) -> list[tuple[str, str]]:
    """(type, name) per event; BOOKMARKs have no name."""
    return [(e["type"], e["raw_object"].get("metadata", {}).get("name", ""))
            for e in events]


async def _client(flavor: str, target: ApiEmulator | Path) -> object:
    if isinstance(target, ApiEmulator):
        return target.async_client() if flavor == "async" else target.sync_client()
    if flavor == "async":
        return await aio_config.new_client_from_config(config_file=str(target))
    return sync_config.new_client_from_config(config_file=str(target))


async def _close(client: object) -> None:
    closer = getattr(client, "close", None)
    if closer is None:
        return
    result = closer()
    if hasattr(result, "__await__"):
        await result


@contextlib.asynccontextmanager
async def open_kube(flavor: str, target: ApiEmulator | Path) -> AsyncIterator[Kube]:
    """A Kube with its own namespace, cleaned up on exit: on the emulator, or on the
    API server a kubeconfig names."""
    client = await _client(flavor, target)
    kube = Kube(flavor, client, target if isinstance(target, ApiEmulator) else None)
    await kube.call("CoreV1Api", "create_namespace", {"metadata": {"name": kube.namespace}})
    kube.later("CoreV1Api", "delete_namespace", kube.namespace)
    try:
        yield kube
    finally:
        await kube.cleanup()
        await _close(client)
