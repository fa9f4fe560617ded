"""A Kubernetes API server emulator for tests, the demo and people.

A real HTTP server on loopback that the unmodified official `kubernetes` client
(sync `kubernetes.client` and async `kubernetes.aio`, watches, leader election)
talks to. It keeps the semantics product code relies on: uid/resourceVersion/
generateName on create, 409 on stale resourceVersion, status subresources, merge,
JSON (with `test`) and strategic merge patches, label and field selectors, watches
with resume, 410 Expired and bookmarks, finalizers.

Async::

    async with ApiEmulator() as api:
        api.seed({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})
        async with api.async_client() as client:
            node = await CoreV1Api(client).read_node("n1")
        assert len(api.writes("PATCH", "/api/v1/nodes/n1")) == 0

Sync (server on a background thread)::

    with ApiEmulator.in_thread() as api:
        api.write_kubeconfig(tmp_path / "kubeconfig")
        CoreV1Api(api.sync_client()).list_node()

Surface (see `emulator._Handle`): `url`, `write_kubeconfig(path, user=)`,
`sync_client(user=)`, `async_client(user=)`; store access without HTTP:
`get(kind, name, namespace)`, `list(kind, namespace)`, `put(obj)`, `seed(*objs)`,
`remove(kind, name, namespace)`, `compact()`, `snapshot()` and `restore(snapshot)`
(etcd backed up, and restored from that backup: versions go back, watches are cut
off); the request log: `requests`,
`writes(method, path_regex)`, `requests_to(method, path_regex)`, `clear_log()`;
faults: `fail(method, path_regex, status, times=, body=, delay=)`, `clear_faults()`,
`go_away()` / `come_back()` (same port; awaitable on `ApiEmulator`); policy hooks:
`authorizer = fn(user, verb, group, resource, subresource, namespace, name) -> bool`
(the bearer token is the user name; 403 when it says no) and
`serve("kueue.x-k8s.io/v1beta2", False)`.

Pytest fixtures for any test folder: `healthd.sim.apiserver.testing` (`api`,
`sync_api`). From a shell: `python -m healthd.sim.apiserver --port 0`.

Known simplifications: no schema validation, no namespace existence check, server
side apply is a merge patch, namespace deletion is immediate, a list's pages
(`limit`/`continue`) come from the bounded history (healthd.sim.apiserver.paging), `/status`
writes ignore metadata changes (stricter than built-in kinds on a real server),
JSON only: kubectl works for get/label/patch/delete and `apply --validate=false`
(no OpenAPI document, no protobuf, so typed `kubectl create` answers 415).
"""

from healthd.sim.apiserver.emulator import ApiEmulator, ThreadedEmulator
from healthd.sim.apiserver.recording import RecordedRequest
from healthd.sim.apiserver.serving import Authorizer

__all__ = ["ApiEmulator", "Authorizer", "RecordedRequest", "ThreadedEmulator"]
