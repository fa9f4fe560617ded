"""`ApiEmulator`: the server's lifecycle, and the handle tests hold.

The same object serves two kinds of callers: async code runs it on its own loop
(`async with ApiEmulator() as api`), sync code and CLIs run it on a background
thread (`with ApiEmulator.in_thread() as api`). Everything but starting and
stopping is plain synchronous methods on the shared `_Handle`, safe from any thread.
"""

from __future__ import annotations

import asyncio
import builtins
import re
import threading
from collections.abc import Coroutine, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import kubernetes.aio.client as aio_client
import kubernetes.client as sync_client
from aiohttp import web

from healthd.sim.apiserver import kubeconfig
from healthd.sim.apiserver.errors import ApiError
from healthd.sim.apiserver.recording import Fault, RecordedRequest, Recorder
from healthd.sim.apiserver.resources import RESOURCES, Obj, ResourceTable, ResourceType
from healthd.sim.apiserver.serving import TOO_LARGE_WAIT_S, ApiHandler, Authorizer, make_app
from healthd.sim.apiserver.store import Snapshot, Store


class _Handle:
    """Store access, request log, faults and clients: the synchronous surface."""

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, history_limit: int = 1000,
                 unserved: tuple[str, ...] = (), bookmark_interval: float = 5.0,
                 too_large_wait_s: float = TOO_LARGE_WAIT_S,
                 authorizer: Authorizer | None = None) -> None:
        self.host = host
        self.port = port
        self.store = Store(history_limit)
        self.table = ResourceTable(unserved=unserved)
        self.recorder = Recorder()
        self._handler = ApiHandler(self.store, self.table, self.recorder,
                                   bookmark_interval=bookmark_interval,
                                   too_large_wait_s=too_large_wait_s)
        self._handler.authorizer = authorizer
        self._runner: web.AppRunner | None = None

    # -- connecting ----------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def write_kubeconfig(self, path: str | Path, user: str = kubeconfig.DEFAULT_USER) -> Path:
        return kubeconfig.write_kubeconfig(path, self.url, user)

    def sync_client(self, user: str = kubeconfig.DEFAULT_USER) -> sync_client.ApiClient:
        return kubeconfig.sync_api_client(self.url, user)

    def async_client(self, user: str = kubeconfig.DEFAULT_USER) -> aio_client.ApiClient:
        return kubeconfig.async_api_client(self.url, user)

    # -- direct store access -------------------------------------------------------

    def _resource(self, kind: str, api_version: str | None = None) -> ResourceType:
        """By kind (`Node`) or plural (`nodes`); the first (preferred) version wins."""
        for rt in RESOURCES:
            if kind in (rt.kind, rt.plural) and api_version in (None, rt.group_version):
                return rt
        raise KeyError(f"unknown resource {kind!r} {api_version or ''}".strip())

    def get(self, kind: str, name: str, namespace: str | None = None, *,
            api_version: str | None = None) -> Obj | None:
        """The stored object, or None."""
        try:
            return self.store.get(self._resource(kind, api_version), namespace or "", name)
        except ApiError:
            return None

    def list(self, kind: str, namespace: str | None = None, *,
             api_version: str | None = None) -> list[Obj]:
        return self.store.list(self._resource(kind, api_version), namespace)[0]

    def put(self, obj: Obj) -> Obj:
        """Create or overwrite `obj` (by its apiVersion and kind), status included."""
        rt = self.table.by_kind(str(obj.get("apiVersion")), str(obj.get("kind")))
        if rt is None:
            raise KeyError(f"unknown kind {obj.get('apiVersion')}/{obj.get('kind')}")
        return self.store.put(rt, obj)

    def seed(self, *objs: Obj) -> builtins.list[Obj]:
        return [self.put(obj) for obj in objs]

    def remove(self, kind: str, name: str, namespace: str | None = None, *,
               api_version: str | None = None) -> None:
        """Remove at once, ignoring finalizers (watchers still see DELETED)."""
        self.store.remove(self._resource(kind, api_version), namespace or "", name)

    def compact(self) -> None:
        """Forget the event history: watches resuming from before now get 410."""
        self.store.compact()

    def snapshot(self) -> Snapshot:
        """What a backup of etcd taken now would hold: every object and the revision."""
        return self.store.snapshot()

    def restore(self, snapshot: Snapshot) -> None:
        """Restore `snapshot` as an etcd restore (with the API server restarted on it)
        does: objects and resourceVersions go back to the snapshot's, open watches are
        cut off, watches from before the snapshot get 410, and writes continue from
        its revision, so versions clients saw before come round again."""
        self.store.restore(snapshot)

    @property
    def resource_version(self) -> int:
        return self.store.resource_version

    # -- request log and faults ----------------------------------------------------

    @property
    def requests(self) -> builtins.list[RecordedRequest]:
        return self.recorder.requests

    def writes(self, method: str | None = None,
               path: str | None = None) -> builtins.list[RecordedRequest]:
        """POST/PUT/PATCH/DELETE requests, by method and path regex (full match)."""
        return self.recorder.matching(method, path, writes_only=True)

    def requests_to(self, method: str | None = None,
                    path: str | None = None) -> builtins.list[RecordedRequest]:
        return self.recorder.matching(method, path)

    def clear_log(self) -> None:
        self.recorder.clear()

    def fail(self, method: str, path: str, status: int | None = 500, *, times: int = 1,
             body: Any = None, delay: float = 0.0,
             query: Mapping[str, str] | None = None) -> None:
        """The next `times` requests matching `method` ("*": any), `path` (regex, full
        match) and every `query` parameter (name -> regex, e.g. {"watch": "true"})
        wait `delay` s, then answer `status` (None: serve normally)."""
        self.recorder.add_fault(Fault(method.upper(), re.compile(path), status, body,
                                      delay, times, dict(query or {})))

    def clear_faults(self) -> None:
        self.recorder.clear_faults()

    # -- policy hooks --------------------------------------------------------------

    @property
    def authorizer(self) -> Authorizer | None:
        return self._handler.authorizer

    @authorizer.setter
    def authorizer(self, value: Authorizer | None) -> None:
        self._handler.authorizer = value

    def serve(self, group_version: str, served: bool = True) -> None:
        """Serve or hide a group/version: hidden ones leave discovery and answer 404."""
        self.table.serve(group_version, served)

    # -- lifecycle (on the server's loop) ------------------------------------------

    async def _start(self) -> None:
        runner = web.AppRunner(make_app(self._handler), access_log=None,
                               handler_cancellation=True, shutdown_timeout=0.2)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        await site.start()
        self._runner = runner
        if self.port == 0:
            self.port = int(runner.addresses[0][1])
        self._handler.server_address = f"{self.host}:{self.port}"

    async def _stop(self) -> None:
        self.store.drop_watches()
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()


class ApiEmulator(_Handle):
    """A Kubernetes API server on loopback, run on the caller's event loop."""

    async def __aenter__(self) -> ApiEmulator:
        await self._start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self._stop()

    async def go_away(self) -> None:
        """Stop listening and cut open watches (objects are kept)."""
        await self._stop()

    async def come_back(self) -> None:
        """Listen again on the same port."""
        await self._start()

    @staticmethod
    def in_thread(**kwargs: Any) -> ThreadedEmulator:
        """The emulator on a background thread, for sync code: `with ... as api:`."""
        return ThreadedEmulator(**kwargs)


class ThreadedEmulator(_Handle):
    """The emulator running its own event loop on a daemon thread."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="api-emulator",
                                        daemon=True)

    def _run(self, coro: Coroutine[Any, Any, None]) -> None:
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=30)

    def __enter__(self) -> ThreadedEmulator:
        self._thread.start()
        self._run(self._start())
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            self._run(self._stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()

    def go_away(self) -> None:
        """Stop listening and cut open watches (objects are kept)."""
        self._run(self._stop())

    def come_back(self) -> None:
        """Listen again on the same port."""
        self._run(self._start())
