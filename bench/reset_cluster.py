"""The cluster `label_to_reset` measures on, with the API emulator in this process
(`InlineCluster`) or in a process of its own (`ProcessCluster`), as a real API
server would be: then every request the controller makes is served by another
process, and the controller's own CPU time is the benchmark's process's.

The cluster (seeded straight into the emulator's store):

- N nodes with 8 GPUs each, all PASS;
- N AppWrappers `Running`, AppWrapper j with 4 GPU pods (2 GPUs each) on nodes
  j..j+3, so every node runs pods of 4 AppWrappers;
- 16 more pods per node that belong to no AppWrapper (20 pods per node: 100,000 at
  5,000 nodes), the slack ClusterQueue and its flavor.

Both kinds answer the same questions: label nodes EVICT as their agents would (the
time of the writes), when each AppWrapper's status PATCH arrived at the server (the
request log's clock), how many Events and requests the server saw, and what the
server process cost. The process kind talks to its child over a pipe; the child
serves HTTP on a thread of its own and answers on its main thread.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import re
import resource
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Protocol

import anyio

from healthd.kube.client import Kube
from healthd.kube.conventions import GPU_RESOURCE, Keys
from healthd.kube.tally import kind_of

KEYS = Keys()
AW_LABEL = "workload.codeflare.dev/appwrapper"
PODS_PER_AW = 4
OTHER_PODS_PER_NODE = 16
NAMESPACES = 10
STATUS_PATH = re.compile(r"/apis/workload\.codeflare\.dev/v1beta2/namespaces/[^/]+/"
                         r"appwrappers/[^/]+/status")
EVENTS_PATH = re.compile(r"/api/v1/namespaces/[^/]+/events")
Obj = dict[str, Any]


# -- the cluster ----------------------------------------------------------------------

def node(i: int, verdict: str = "PASS") -> Obj:
    capacity = {GPU_RESOURCE: "8", "cpu": "96", "memory": "1Ti", "pods": "110"}
    annotations = {}
    if verdict == "EVICT":
        annotations[KEYS.health] = json.dumps({"verdict": "EVICT", "top": "XID_79", "held": [
            {"code": "XID_79", "severity": "EVICT"}]})
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": f"node-{i:05d}", "labels": {KEYS.gpuhealth: verdict},
                         "annotations": annotations},
            "spec": {}, "status": {"capacity": capacity, "allocatable": capacity}}


def namespace(j: int) -> str:
    return f"team-{j % NAMESPACES}"


def appwrapper(j: int) -> Obj:
    return {"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper",
            "metadata": {"name": f"aw-{j:05d}", "namespace": namespace(j)},
            "spec": {"suspend": False, "components": []},
            "status": {"phase": "Running", "conditions": [
                {"type": "QuotaReserved", "status": "True", "reason": "Resuming",
                 "message": "", "lastTransitionTime": "2025-01-01T00:00:00Z"}]}}


def pod(name: str, ns: str, node_index: int, *, owner: str | None, gpus: int) -> Obj:
    resources = {"requests": {GPU_RESOURCE: str(gpus)}, "limits": {GPU_RESOURCE: str(gpus)}} \
        if gpus else {"requests": {"cpu": "100m"}}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns,
                         "labels": {AW_LABEL: owner} if owner else {"app": "daemon"}},
            "spec": {"nodeName": f"node-{node_index:05d}", "containers": [
                {"name": "main", "image": "trainer", "resources": resources}]},
            "status": {"phase": "Running"}}


def cluster(n: int, other_pods: int = OTHER_PODS_PER_NODE) -> Iterable[Obj]:
    """The objects, nodes first; `other_pods` per node that belong to no AppWrapper."""
    for i in range(n):
        yield node(i)
    for j in range(n):
        aw = appwrapper(j)
        yield aw
        for k in range(PODS_PER_AW):
            yield pod(f"aw-{j:05d}-{k}", namespace(j), (j + k) % n,
                      owner=aw["metadata"]["name"], gpus=2)
        for k in range(other_pods):
            yield pod(f"daemon-{j:05d}-{k}", "kube-system", j, owner=None, gpus=0)
    flavor = "default-flavor"
    yield {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
           "metadata": {"name": flavor}, "spec": {}}
    yield {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
           "metadata": {"name": "slack-cluster-queue"},
           "spec": {"cohortName": "default-cohort", "namespaceSelector": {}, "resourceGroups": [
               {"coveredResources": [GPU_RESOURCE], "flavors": [{"name": flavor, "resources": [
                   {"name": GPU_RESOURCE, "nominalQuota": str(8 * n // 10)}]}]}]}}


def owners_on(i: int, n: int) -> list[tuple[str, str]]:
    """(namespace, name) of the AppWrappers with pods on node i."""
    return [(namespace(j), f"aw-{j:05d}") for j in ((i - k) % n for k in range(PODS_PER_AW))]


def pods(n: int, other_pods: int = OTHER_PODS_PER_NODE) -> int:
    return n * (PODS_PER_AW + other_pods)


# -- what the server saw --------------------------------------------------------------

WRITTEN_BY = "node_modified_by "  # a count of Node writes, by writer, follows


class ResetLog:
    """When each AppWrapper was seen reset, when the last Event came, and what was
    seen counted by kind; filled by whoever sees the server (the emulator's request
    log, or watches on a real API server). Thread-safe: it is filled on one thread
    and waited on from another. It wakes a waiter only when what it waits for is
    complete, so the benchmark adds next to nothing to the server's CPU."""

    def __init__(self) -> None:
        self.reset_at: dict[str, float] = {}
        self.counts: Counter[str] = Counter()
        self.last_event_at = 0.0
        self.all_reset = threading.Event()
        self._awaited: set[str] = set()
        self._lock = threading.Lock()
        self._listeners: list[Any] = []

    def note_reset(self, name: str, at: float) -> None:
        """AppWrapper `name` was reset at epoch time `at` (the first time counts)."""
        with self._lock:
            self.reset_at.setdefault(name, at)
            self._awaited.discard(name)
            if not self._awaited:
                self.all_reset.set()
        self._notify()

    def note_event(self, at: float) -> None:
        with self._lock:
            self.counts["event_post"] += 1
            self.last_event_at = at
        self._notify()

    def count(self, kind: str) -> None:
        with self._lock:
            self.counts[kind] += 1

    def _notify(self) -> None:
        for listener in self._listeners:
            listener()

    def expect(self, names: Iterable[str]) -> None:
        """`all_reset` is set once every one of `names` has been reset."""
        with self._lock:
            self._awaited = set(names) - self.reset_at.keys()
            if self._awaited:
                self.all_reset.clear()
            else:
                self.all_reset.set()

    def listen(self, callback: Any) -> None:
        """Also call `callback()` after each reset or Event (on the thread that saw
        it)."""
        self._listeners.append(callback)


class ServerLog(ResetLog):
    """A `ResetLog` filled from the emulator's request log (so waiting reads nothing
    back from the store): a status PATCH accepted is a reset, an Event POST an
    Event; other requests are counted by method."""

    def __init__(self, api: Any) -> None:
        super().__init__()
        record = api.recorder.record

        def recording(entry: Any) -> None:
            record(entry)
            self._note(entry)

        api.recorder.record = recording

    def _note(self, entry: Any) -> None:
        if entry.method == "PATCH" and STATUS_PATH.fullmatch(entry.path):
            self.count("status_patch")
            if entry.status == 200:
                self.note_reset(entry.path.split("/")[-2], entry.time)
        elif entry.method == "POST" and EVENTS_PATH.fullmatch(entry.path):
            self.note_event(entry.time)
        else:
            self.count(f"{entry.method.lower()}_other")


def evict_in_store(api: Any, indexes: Iterable[int]) -> float:
    """Label nodes EVICT as their agents would; the epoch time of the writes."""
    at = time.time()
    for i in indexes:
        stored = api.get("Node", f"node-{i:05d}")
        assert stored is not None
        fresh = node(i, "EVICT")
        stored["metadata"]["labels"] = fresh["metadata"]["labels"]
        stored["metadata"]["annotations"] = fresh["metadata"]["annotations"]
        api.put(stored)
    return at


def own_cpu_s() -> float:
    """CPU seconds (user + system, all threads) this process has used."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def rss_mib(pid: int | str = "self") -> float:
    """Resident set size of a process now, MiB (from /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


# -- the two kinds of cluster ---------------------------------------------------------

class Cluster(Protocol):
    """What `label_to_reset` asks of a cluster, wherever its API server runs."""

    n: int
    where: str  # "in-process" or "own-process"
    seed_s: float

    async def connect(self) -> Kube: ...
    async def evict(self, indexes: list[int]) -> float: ...
    async def reset_times(self, names: list[str], wait_s: float) -> dict[str, float]: ...
    async def events_quiet(self, quiet_s: float, wait_s: float) -> float: ...
    async def counts(self) -> dict[str, int]: ...
    async def server_usage(self) -> dict[str, float] | None: ...
    async def served(self) -> dict[str, float]: ...


class InlineCluster:
    """The emulator on the controller's own event loop (every request costs this
    process twice: sending it and serving it)."""

    where = "in-process"

    def __init__(self, api: Any, n: int) -> None:
        self.api = api
        self.n = n
        started = time.monotonic()
        api.seed(*cluster(n))
        self.seed_s = time.monotonic() - started
        self.log = ServerLog(api)
        self._changed = anyio.Event()
        self.log.listen(lambda: self._changed.set())  # the Event of the moment

    async def connect(self) -> Kube:
        return Kube(self.api.async_client(), timeout_s=30)

    async def evict(self, indexes: list[int]) -> float:
        return evict_in_store(self.api, indexes)

    async def reset_times(self, names: list[str], wait_s: float) -> dict[str, float]:
        pending = set(names)
        with anyio.fail_after(wait_s):
            while pending := pending - self.log.reset_at.keys():
                await self._wait()
        return {name: self.log.reset_at[name] for name in names}

    async def events_quiet(self, quiet_s: float, wait_s: float) -> float:
        with anyio.fail_after(wait_s):
            while (idle := time.time() - self.log.last_event_at) < quiet_s:
                with anyio.move_on_after(quiet_s - idle):
                    await self._wait()
        return self.log.last_event_at

    async def _wait(self) -> None:
        await self._changed.wait()
        self._changed = anyio.Event()

    async def counts(self) -> dict[str, int]:
        return dict(self.log.counts)

    async def server_usage(self) -> dict[str, float] | None:
        return None  # the server's CPU is this process's

    async def served(self) -> dict[str, float]:
        return served_by_emulator(self.api)


class ProcessCluster:
    """The API server's side in a child process; use as `async with ProcessCluster(n)
    as c`. By default the child is the emulator (`serve_cluster`); another `serve`
    (e.g. one that starts a real API server and watches it) answers the same
    questions over the same pipe: `serve(n, *args, conn)`."""

    def __init__(self, n: int, *, history_limit: int = 1000, serve: Any = None,
                 args: tuple[Any, ...] = (), where: str = "own-process",
                 stop_s: float = 30) -> None:
        self.n = n
        self.where = where
        self.seed_s = 0.0
        self.ready: dict[str, Any] = {}  # what the child said when it was ready
        self._serve = serve or serve_cluster
        self._args = args if serve else (history_limit,)
        self._stop_s = stop_s
        self._conn: Connection | None = None
        self._child: Any = None
        self._kubeconfig = Path()
        self._lock = anyio.Lock()

    async def __aenter__(self) -> ProcessCluster:
        ours, theirs = multiprocessing.Pipe()
        self._child = multiprocessing.get_context("spawn").Process(
            target=self._serve, args=(self.n, *self._args, theirs),
            name="api-server-side", daemon=True)
        self._child.start()
        theirs.close()
        self._conn = ours
        try:
            self.ready = await self._ask(None, wait_s=3600)
        except BaseException:
            await self.__aexit__()
            raise
        self._kubeconfig, self.seed_s = Path(self.ready["kubeconfig"]), self.ready["seed_s"]
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._conn is not None:
            with contextlib.suppress(OSError):  # the child may be gone already
                self._conn.send(("stop", None))
            self._conn.close()
            self._conn = None
        if self._child is not None:
            await anyio.to_thread.run_sync(self._child.join, self._stop_s)
            if self._child.is_alive():
                self._child.kill()

    @property
    def pid(self) -> int:
        return int(self._child.pid)

    async def _ask(self, command: tuple[str, Any] | None, *, wait_s: float = 60) -> Any:
        """Send `command` (None: just read the next answer) and wait for the answer."""
        assert self._conn is not None
        conn = self._conn
        async with self._lock:
            if command is not None:
                conn.send(command)
            # A thread blocked on the pipe costs this process (the one measured) no CPU.
            if not await anyio.to_thread.run_sync(conn.poll, wait_s):
                raise TimeoutError(f"the API server's process did not answer {command!r}")
            try:
                kind, value = conn.recv()
            except EOFError:
                raise RuntimeError("the API server's process exited") from None
        if kind == "error":
            raise RuntimeError(f"the API server's process failed: {value}")
        return value

    async def connect(self) -> Kube:
        return await Kube.connect(str(self._kubeconfig), timeout_s=30)

    async def evict(self, indexes: list[int]) -> float:
        return float(await self._ask(("evict", indexes)))

    async def reset_times(self, names: list[str], wait_s: float) -> dict[str, float]:
        return dict(await self._ask(("resets", (names, wait_s)), wait_s=wait_s + 5))

    async def events_quiet(self, quiet_s: float, wait_s: float) -> float:
        return float(await self._ask(("events_quiet", (quiet_s, wait_s)), wait_s=wait_s + 5))

    async def counts(self) -> dict[str, int]:
        return dict(await self._ask(("counts", None)))

    async def server_usage(self) -> dict[str, float] | None:
        return dict(await self._ask(("usage", None)))

    async def served(self) -> dict[str, float]:
        return dict(await self._ask(("served", None)))


# -- the child process ----------------------------------------------------------------

def serve_cluster(n: int, history_limit: int, conn: Connection) -> None:
    """The emulator process: seed, serve on a thread, answer the parent's questions
    on this one until told to stop."""
    from healthd.sim.apiserver.emulator import ApiEmulator
    try:
        with ApiEmulator.in_thread(history_limit=history_limit) as api, \
                tempfile.TemporaryDirectory() as tmp:
            started = time.monotonic()
            api.seed(*cluster(n))
            seed_s = time.monotonic() - started
            log = ServerLog(api)
            kubeconfig = api.write_kubeconfig(Path(tmp) / "kubeconfig")
            conn.send(("ready", {"kubeconfig": str(kubeconfig), "seed_s": seed_s}))
            answer(EmulatorSide(api), log, conn)
    except Exception as exc:  # tell the parent instead of leaving it waiting
        conn.send(("error", f"{type(exc).__name__}: {exc}"))


class ServerSide(Protocol):
    """What differs between the children: how nodes turn EVICT, what the server costs."""

    def evict(self, indexes: list[int]) -> float: ...
    def usage(self) -> dict[str, float]: ...
    def served(self) -> dict[str, float]: ...


class EmulatorSide:
    def __init__(self, api: Any) -> None:
        self.api = api

    def evict(self, indexes: list[int]) -> float:
        return evict_in_store(self.api, indexes)

    def usage(self) -> dict[str, float]:
        return {"cpu_s": own_cpu_s(), "rss_mib": rss_mib(os.getpid())}

    def served(self) -> dict[str, float]:
        return served_by_emulator(self.api)


def served_by_emulator(api: Any) -> dict[str, float]:
    """Requests and request bytes by kind, from the emulator's request log (the
    benchmark's own label writes go straight to its store, so these are healthd's)."""
    out: Counter[str] = Counter()
    for r in api.recorder.requests:
        kind = kind_of(r.method, r.path, r.body)
        out[f"requests {kind}"] += 1
        out[f"request_bytes {kind}"] += r.size
    return dict(out)


def answer(side: ServerSide, log: ResetLog, conn: Connection) -> None:
    """Answer the parent's questions on this thread until told to stop."""
    while True:
        command, arg = conn.recv()
        if command == "stop":
            return
        try:
            conn.send(("ok", _one(side, log, command, arg)))
        except Exception as exc:  # one bad question must not leave the parent waiting
            conn.send(("error", f"{command}: {type(exc).__name__}: {exc}"))


def _one(side: ServerSide, log: ResetLog, command: str, arg: Any) -> Any:
    if command == "evict":
        return side.evict(arg)
    if command == "resets":
        names, wait_s = arg
        log.expect(names)
        if not log.all_reset.wait(wait_s):
            raise TimeoutError(f"{len(set(names) - log.reset_at.keys())} AppWrappers "
                               f"not reset within {wait_s} s")
        return {name: log.reset_at[name] for name in names}
    if command == "events_quiet":
        quiet_s, wait_s = arg
        deadline = time.monotonic() + wait_s
        while (idle := time.time() - log.last_event_at) < quiet_s:
            if time.monotonic() > deadline:
                raise TimeoutError(f"Events still arriving after {wait_s} s")
            time.sleep(quiet_s - idle)
        return log.last_event_at
    if command == "counts":
        return dict(log.counts)
    if command == "usage":
        return side.usage()
    if command == "served":
        return side.served()
    raise ValueError(f"unknown command {command!r}")
