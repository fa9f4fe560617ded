"""The HTTP face of the emulator: routing, verbs, authorization, log and faults.

One aiohttp handler takes every request: it records it, applies an armed fault,
parses the Kubernetes URL (`/api/v1[/namespaces/NS]/PLURAL[/NAME[/SUB]]` and the
`/apis/GROUP/VERSION/...` equivalent), asks the optional authorizer, and maps the
verb onto the store. Every refusal is a `kind: Status` body with the real status
code, so the official client raises the `ApiException` it would raise on a cluster.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from healthd.sim.apiserver import deep, discovery, paging, tables
from healthd.sim.apiserver.errors import ApiError, status_body
from healthd.sim.apiserver.recording import Fault, RecordedRequest, Recorder, now
from healthd.sim.apiserver.resources import ResourceTable, ResourceType
from healthd.sim.apiserver.selectors import Selector
from healthd.sim.apiserver.store import Expired, Store
from healthd.sim.apiserver.watching import WatchRequest, is_watch, serve_watch

log = logging.getLogger(__name__)

# authorize(user, verb, group, resource, subresource, namespace, name) -> allowed
Authorizer = Callable[[str, str, str, str, str, str | None, str | None], bool]

_NOT_NAMESPACE_CHILDREN = ("status", "finalize")
TOO_LARGE_WAIT_S = 3.0  # the real watch cache's wait for a version it has not reached
_SUBRESOURCES = ("status",)


@dataclass(frozen=True)
class Target:
    """The resource a URL names."""

    rt: ResourceType
    namespace: str | None
    name: str | None
    subresource: str


def _verb(method: str, target: Target, query: dict[str, str]) -> str:
    if method == "GET":
        if target.name:
            return "get"
        return "watch" if is_watch(query) else "list"
    collection = {"POST": "create", "DELETE": "deletecollection"}
    item = {"PUT": "update", "PATCH": "patch", "DELETE": "delete"}
    verb = (item if target.name else collection).get(method)
    if verb is None:
        raise ApiError(405, f"the server does not allow this method on the requested "
                       f"resource ({method})", "MethodNotAllowed")
    return verb


def _user(request: web.Request) -> str:
    """The bearer token is the user name: the emulator trusts whoever calls it."""
    auth = request.headers.get("Authorization", "")
    return auth[7:].strip() if auth.startswith("Bearer ") else "system:anonymous"


def _limit(query: dict[str, str]) -> int | None:
    """The list's `limit` (None: absent, 0 or not a number: the real server ignores
    those rather than refusing them)."""
    try:
        limit = int(query.get("limit") or 0)
    except ValueError:
        return None
    return limit if limit > 0 else None


def _as_items(items: list[Any], rt: ResourceType) -> list[Any]:
    """A List's items as the real server sends them: a built-in kind's without
    `apiVersion` and `kind` (the List names them once; a client that needs them
    sets them, as client-go's decoder does), a custom resource's with them."""
    if rt.is_custom:
        return items
    for item in items:
        item.pop("apiVersion", None)
        item.pop("kind", None)
    return items


def _selects(query: dict[str, str]) -> bool:
    return bool(query.get("labelSelector") or query.get("fieldSelector"))


def _json(body: Any, status: int = 200) -> web.Response:
    return web.json_response(body, status=status, dumps=deep.dumps)


class ApiHandler:
    """The request handler shared by every (re)start of the server."""

    def __init__(self, store: Store, table: ResourceTable, recorder: Recorder, *,
                 bookmark_interval: float = 5.0,
                 too_large_wait_s: float = TOO_LARGE_WAIT_S) -> None:
        self.store = store
        self.table = table
        self.recorder = recorder
        self.bookmark_interval = bookmark_interval
        self.too_large_wait_s = too_large_wait_s
        self.authorizer: Authorizer | None = None
        self.server_address = "127.0.0.1"

    async def handle(self, request: web.Request) -> web.StreamResponse:
        started = now()
        text = await request.text()
        body = self._parse_body(text)
        recorded: list[int] = []

        def record(status: int) -> None:
            recorded.append(status)
            self.recorder.record(RecordedRequest(
                request.method, request.path, dict(request.query),
                request.headers.get("Content-Type", ""), body, status, started,
                request.headers.get("User-Agent", ""), _user(request), len(text.encode())))

        try:
            resp = await self._faulted(request) or await self._dispatch(request, body, record)
        except ApiError as exc:
            resp = _json(exc.body, exc.code)
        except Exception as exc:  # a bug here must reach the client, not kill the server
            log.exception("emulator failed on %s %s", request.method, request.path)
            resp = _json(status_body(500, f"emulator error: {exc!r}"), 500)
        if not recorded:
            record(resp.status)
        return resp

    @staticmethod
    def _parse_body(text: str) -> Any:
        if not text.strip():
            return None
        try:
            return deep.loads(text)  # too-deep values kept as the real server keeps them
        except ValueError:
            return text

    async def _faulted(self, request: web.Request) -> web.StreamResponse | None:
        fault: Fault | None = self.recorder.take_fault(request.method, request.path, request.query)
        if fault is None:
            return None
        if fault.delay:
            await asyncio.sleep(fault.delay)
        if fault.status is None:
            return None
        body = fault.body if fault.body is not None else status_body(
            fault.status, f"injected fault: {fault.status}")
        if isinstance(body, (dict, list)):
            return _json(body, fault.status)
        return web.Response(status=fault.status, text=str(body))

    # -- routing -------------------------------------------------------------------

    def _discovery(self, segs: list[str]) -> dict[str, Any] | None:
        if segs == ["version"]:
            return discovery.VERSION_INFO
        if segs == ["api"]:
            return discovery.api_versions(self.server_address)
        if segs == ["apis"]:
            return discovery.api_group_list(self.table)
        if len(segs) == 2 and segs[0] == "apis":
            return discovery.api_group(self.table, segs[1])
        if len(segs) == 2 and segs[0] == "api":
            return discovery.api_resource_list(self.table, "", segs[1])
        if len(segs) == 3 and segs[0] == "apis":
            return discovery.api_resource_list(self.table, segs[1], segs[2])
        raise LookupError

    def _target(self, segs: list[str]) -> Target:
        if segs[0] == "api" and len(segs) > 2:
            group, version, rest = "", segs[1], segs[2:]
        elif segs[0] == "apis" and len(segs) > 3:
            group, version, rest = segs[1], segs[2], segs[3:]
        else:
            raise ApiError(404, "the server could not find the requested resource")
        namespace = None
        if rest[0] == "namespaces" and len(rest) >= 3 and rest[2] not in _NOT_NAMESPACE_CHILDREN:
            namespace, rest = rest[1], rest[2:]
        rt = self.table.lookup(group, version, rest[0])
        sub = rest[2] if len(rest) > 2 else ""
        if rt is None or len(rest) > 3 or (namespace and not rt.namespaced) \
                or (sub and (sub not in _SUBRESOURCES or not rt.status)):
            raise ApiError(404, "the server could not find the requested resource")
        return Target(rt, namespace, rest[1] if len(rest) > 1 else None, sub)

    def _authorize(self, request: web.Request, verb: str, target: Target) -> None:
        if self.authorizer is None:
            return
        user = _user(request)
        rt = target.rt
        if not self.authorizer(user, verb, rt.group, rt.plural, target.subresource,
                               target.namespace, target.name):
            what = rt.plural + (f"/{target.subresource}" if target.subresource else "")
            scope = f' in the namespace "{target.namespace}"' if target.namespace else \
                " at the cluster scope"
            raise ApiError(403, f'{what} is forbidden: User "{user}" cannot {verb} resource '
                           f'"{what}" in API group "{rt.group}"{scope}', "Forbidden")

    async def _dispatch(self, request: web.Request, body: Any,
                        record: Callable[[int], None]) -> web.StreamResponse:
        segs = [s for s in request.path.split("/") if s]
        if not segs:
            raise ApiError(404, "the server could not find the requested resource")
        try:
            doc = self._discovery(segs)
        except LookupError:
            pass
        else:
            if doc is None:
                raise ApiError(404, "the server could not find the requested resource")
            return _json(doc)
        target = self._target(segs)
        query = dict(request.query)
        verb = _verb(request.method, target, query)
        self._authorize(request, verb, target)
        if verb == "watch":
            watch = WatchRequest.parse(target.rt, target.namespace, self._selector(target, query),
                                       query)
            record(200)
            return await serve_watch(request, self.store, watch,
                                     bookmark_interval=self.bookmark_interval)
        if verb in ("get", "list") and tables.wants_table(request.headers.get("Accept", "")):
            printed = self._table(target, query)
            if printed is not None:
                return _json(printed)
        handler: Callable[..., Awaitable[web.StreamResponse]] = getattr(self, f"_{verb}")
        return await handler(target, body, query, request.headers.get("Content-Type", ""))

    def _table(self, target: Target, query: dict[str, str]) -> dict[str, Any] | None:
        """What `kubectl get` prints, for the kinds with a printer (see `tables`)."""
        rt = target.rt
        core = self.table.lookup("", "v1", rt.plural) if rt.storage_key == "events" else rt
        if core is None:
            return None
        if target.name:
            items = [self.store.get(core, target.namespace or "", target.name)]
            rv = items[0]["metadata"]["resourceVersion"]
        else:
            items, at = self.store.list(core, target.namespace, self._selector(target, query))
            rv = str(at)
        return tables.table(core.group, core.kind, items, rv)

    @staticmethod
    def _selector(target: Target, query: dict[str, str]) -> Selector:
        return Selector.parse(target.rt, query.get("labelSelector"), query.get("fieldSelector"))

    # -- verbs ---------------------------------------------------------------------

    @staticmethod
    def _object_body(body: Any, content_type: str = "") -> dict[str, Any]:
        if content_type and "json" not in content_type:
            raise ApiError(415, f"the body of the request was in an unknown format: "
                           f"{content_type}; the emulator speaks JSON only")
        if not isinstance(body, dict):
            raise ApiError.bad_request("the request body must be a JSON object")
        return body

    async def _get(self, target: Target, *_: Any) -> web.Response:
        return _json(self.store.get(target.rt, target.namespace or "", str(target.name)))

    async def _list(self, target: Target, _body: Any, query: dict[str, str],
                    _ct: str) -> web.Response:
        rt = target.rt
        limit = _limit(query)
        if limit is None and not query.get("continue"):
            await self._not_too_large(query.get("resourceVersion"))
            items, rv = self.store.list(rt, target.namespace, self._selector(target, query))
            return _json({"kind": f"{rt.kind}List", "apiVersion": rt.group_version,
                          "metadata": {"resourceVersion": str(rv)},
                          "items": _as_items(items, rt)})
        after = paging.start_of(query)
        if after is None:
            await self._not_too_large(query.get("resourceVersion"))
        try:
            items, following, rest = self.store.page(
                rt, target.namespace, self._selector(target, query),
                limit or paging.UNLIMITED, after)
        except Expired:
            raise paging.expired() from None
        meta = paging.list_meta(after.rv if after else self.store.resource_version,
                                following, rest, counted=not _selects(query))
        return _json({"kind": f"{rt.kind}List", "apiVersion": rt.group_version,
                      "metadata": meta, "items": _as_items(items, rt)})

    async def _not_too_large(self, version: str | None) -> None:
        """A list from a version newer than the server's own (a restored or replaced
        server) waits for it as the real one's watch cache does, `too_large_wait_s`
        (3 s there), and is answered if it comes; else refused as the real one refuses."""
        if not version or not version.isdigit():
            return
        if await self.store.reached(int(version), self.too_large_wait_s):
            return
        current = self.store.resource_version
        raise ApiError(504, f"Too large resource version: {version}, current: {current}",
                       "Timeout", {"causes": [{"reason": "ResourceVersionTooLarge",
                                               "message": "Too large resource version"}],
                                   "retryAfterSeconds": 1})

    async def _create(self, target: Target, body: Any, _query: dict[str, str],
                      content_type: str) -> web.Response:
        obj = self.store.create(target.rt, target.namespace or "",
                                self._object_body(body, content_type))
        return _json(obj, 201)

    async def _update(self, target: Target, body: Any, _query: dict[str, str],
                      content_type: str) -> web.Response:
        return _json(self.store.replace(target.rt, target.namespace or "", str(target.name),
                                        self._object_body(body, content_type),
                                        subresource=target.subresource))

    async def _patch(self, target: Target, body: Any, _query: dict[str, str],
                     content_type: str) -> web.Response:
        if body is None or isinstance(body, str):
            raise ApiError.bad_request("the patch body must be JSON")
        return _json(self.store.patch(target.rt, target.namespace or "", str(target.name),
                                      content_type, body, subresource=target.subresource))

    async def _delete(self, target: Target, body: Any, *_: Any) -> web.Response:
        rt = target.rt
        pre = body.get("preconditions") if isinstance(body, dict) else None
        obj, gone = self.store.delete(rt, target.namespace or "", str(target.name), pre)
        if not gone or rt.returns_deleted:
            return _json(obj)
        return _json({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                      "details": {"name": target.name, "group": rt.group, "kind": rt.plural,
                                  "uid": obj["metadata"].get("uid")}})

    async def _deletecollection(self, target: Target, _body: Any, query: dict[str, str],
                                _ct: str) -> web.Response:
        rt = target.rt
        items, _ = self.store.list(rt, target.namespace, self._selector(target, query))
        deleted = []
        for item in items:
            meta = item["metadata"]
            deleted.append(self.store.delete(rt, meta.get("namespace", ""), meta["name"])[0])
        return _json({"kind": f"{rt.kind}List", "apiVersion": rt.group_version,
                      "metadata": {"resourceVersion": str(self.store.resource_version)},
                      "items": deleted})


def make_app(handler: ApiHandler) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", handler.handle)
    return app
