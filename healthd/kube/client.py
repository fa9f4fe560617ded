"""`Kube`: healthd's one door to the Kubernetes API.

Every request healthd makes goes through `Kube._send`, on top of the official
`kubernetes.aio` ApiClient (its configuration, TLS and token refresh; none of its
model classes). That one place builds the URL from a `Resource`, applies a
deadline, and turns every failure (an HTTP status, a refused or reset connection,
a timeout, a body that is not JSON) into `healthd.kube.errors`, so nothing above
this module handles `kubernetes` or `aiohttp` exceptions. Objects travel as plain
JSON dicts, exactly as the server sends them.

The verbs (`get`, `list`, `create`, `replace`, `delete`, the three patch kinds)
are thin wrappers over `request`; `stream` serves watches (JSON lines).

Dead connections (a load balancer that failed over, a conntrack flush: the
connection stays open but nothing arrives, no FIN, no RST) are noticed within a
bound, set here: a request within its deadline (`timeout_s`); a watch within
`watch_timeout_s` (its server-side `timeoutSeconds`) plus `watch_read_margin_s`;
an idle connection whose peer vanished by TCP keepalive. When a request or a watch
passes its deadline, every connection of the client is dropped (pooled ones and
open watches alike, as the kubelet does after a failed heartbeat), so the next
request, a Lease renewal say, goes out over a fresh connection.

Usage::

    async with await Kube.connect() as kube:
        node = await kube.get(NODES, "gpu-1")
        await kube.merge_patch(NODES, "gpu-1", {"metadata": {"labels": {"a": "b"}}})
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncGenerator, Iterator, Mapping
from contextlib import aclosing
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp
import anyio
import yaml
from aiohttp.helpers import get_env_proxy_for_url
from yarl import URL

from healthd.kube.decoding import (
    UNDECODABLE,
    UndecodableObjects,
    loads,
    plural_of,
    sift_answer,
    sift_event,
)
from healthd.kube.errors import KubeError, Unavailable, from_status
from healthd.kube.narrow import (
    ApiClient,
    ApiException,
    ConfigException,
    Configuration,
    RESTResponse,
    load_incluster_config,
    load_kube_config,
)
from healthd.kube.objects import Resource
from healthd.kube.tally import RequestTally

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
_AUTH = ["BearerToken"]
_CHUNK_LIMIT = 16 * 2**20  # a watch line larger than this is not a Kubernetes object
_CATCH_UP_S = 0.005  # a batched stream's wait for what its pause left in the socket
WATCH_TIMEOUT_S = 60  # each watch's timeoutSeconds: the server ends it then, we resume
WATCH_READ_MARGIN_S = 10  # past timeoutSeconds, a silent watch is a dead connection
# TCP keepalive: an idle connection whose peer is gone is closed after about
# idle + interval * count seconds (client-go probes after 30 s too).
_KEEPALIVE = (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3))

Query = Mapping[str, str | int | bool | None]
JsonPatch = list[dict[str, Any]]  # RFC 6902 operations


class Kube:
    """Facade over a kubernetes.aio ApiClient; every request goes through `request`.

    `timeout_s` is the default deadline of one request (connect, send, read the
    answer); a request that passes it raises `Unavailable`. `watch_timeout_s` is
    each watch's server-side timeout; a watch silent `watch_read_margin_s` longer
    than that is a dead connection (see the module docstring). `tally`, when set,
    counts every request and its bytes (`healthd.kube.tally`). Objects too deeply
    nested to decode are left out of answers and counted in `undecodable` (the
    process's tally unless given; healthd.kube.decoding).
    """

    def __init__(self, api_client: ApiClient, *, timeout_s: float = 10,
                 watch_timeout_s: int = WATCH_TIMEOUT_S,
                 watch_read_margin_s: float = WATCH_READ_MARGIN_S,
                 undecodable: UndecodableObjects | None = None) -> None:
        _environment_once(api_client)
        self._client = api_client
        self.undecodable = UNDECODABLE if undecodable is None else undecodable
        self.timeout_s = timeout_s
        self.watch_timeout_s = watch_timeout_s
        self.watch_read_margin_s = watch_read_margin_s
        self._generation = 0  # how many times the connections were dropped
        self._streams: set[aiohttp.StreamReader] = set()  # bodies of the open watches
        self.tally: RequestTally | None = None  # counts requests when set (measuring only)

    # -- construction --------------------------------------------------------------

    @classmethod
    async def connect(cls, kubeconfig: str | None = None, *, context: str | None = None,
                      timeout_s: float = 10) -> Kube:
        """A client from `kubeconfig` when given; else from $KUBECONFIG; else the pod's
        service account (in-cluster); else ~/.kube/config. `context` picks a kubeconfig
        context other than its current one. KubeError when none works."""
        config = await _load_configuration(kubeconfig, context)
        return cls(ApiClient(config), timeout_s=timeout_s)

    async def close(self) -> None:
        await self._client.close()

    async def __aenter__(self) -> Kube:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()

    @property
    def host(self) -> str:
        """The API server URL, for log lines."""
        return str(self._client.configuration.host)

    async def drop_connections(self, generation: int | None = None) -> None:
        """Close every connection (pooled ones and open watches: those resume on fresh
        ones); the next request connects anew. With `generation`, only when no drop
        happened since that `_generation` was read: a fresh pool is kept."""
        if generation is not None and generation != self._generation:
            return
        self._generation += 1
        # aiohttp closes a connection without waking a reader of its body: wake each
        # open watch with the error of a lost connection, so it resumes elsewhere.
        for body in self._streams:
            body.set_exception(aiohttp.ClientConnectionError("connections dropped"))
        rest = self._client.rest_client
        session, rest.pool_manager = rest.pool_manager, None
        retrying, rest.retry_client = rest.retry_client, None
        if retrying is not None:
            await retrying.close()
        if session is not None:
            await session.close()

    async def _timed_out(self, generation: int, what: str, deadline: float) -> Unavailable:
        """The error for a request or stream past its deadline, after dropping the
        connections it may have been stuck on."""
        await self.drop_connections(generation)
        return Unavailable(f"{what}: no answer within {deadline:g} s", reason="Timeout")

    # -- the choke point -----------------------------------------------------------

    async def request(self, method: str, path: str, *, query: Query | None = None,
                      body: Any = None, content_type: str | None = None,
                      timeout_s: float | None = None) -> dict[str, Any]:
        """Send one request and return the answer's JSON object ({} for an empty body).

        Raises a `healthd.kube.errors.KubeError` subclass for every failure.
        """
        deadline = self.timeout_s if timeout_s is None else timeout_s
        generation = self._generation
        try:
            with anyio.fail_after(deadline):
                resp = await self._send(method, path, query, body, content_type,
                                        aiohttp.ClientTimeout(total=deadline + 1))
                raw = await _read(resp)
        except TimeoutError as exc:
            raise await self._timed_out(generation, f"{method} {path}", deadline) from exc
        except KubeError:
            if self.tally is not None:
                self.tally.note(method, path, body, 0, failed=True)
            raise
        if self.tally is not None:
            self.tally.note(method, path, body, len(raw))
        value, pruned = _decode(method, path, raw)
        if pruned:
            return sift_answer(value, f"{method} {path}", plural_of(path), self.undecodable)
        return value

    async def stream(self, path: str, *, query: Query | None = None,
                     timeout_s: float | None = None,
                     read_timeout_s: float | None = None,
                     batch_s: float = 0) -> AsyncGenerator[dict[str, Any], None]:
        """GET `path` and yield each JSON line of the answer (a watch) as it arrives.

        `timeout_s` bounds getting the answer's headers, `read_timeout_s` the wait
        for each further piece (None: no bound). The stream ends when the server
        ends it; a broken connection raises `Unavailable`, and so does silence
        past either bound (all connections are dropped then, see `request`).

        With `batch_s`, once something arrives the connection is not read for
        `batch_s`: what the server sends meanwhile waits in the socket, and is
        read and yielded with what came first. Each read costs a wake-up of the
        process (on a VM about as much as decoding the line), so a stream of many
        small events (thousands of Nodes heartbeating) costs a few wake-ups per
        `batch_s`, not one per event; events sent together (a rack failing) are
        yielded together; each comes at most `batch_s` later.
        """
        deadline = self.timeout_s if timeout_s is None else timeout_s
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=deadline,
                                        sock_read=read_timeout_s)
        generation = self._generation
        try:
            with anyio.fail_after(deadline):
                resp = await self._send("GET", path, query, None, None, timeout)
        except TimeoutError as exc:
            raise await self._timed_out(generation, f"GET {path}", deadline) from exc
        body = resp.response.content
        self._streams.add(body)
        try:
            if resp.status >= 300:
                await _read(resp)  # raises the translated error
            async with aclosing(_lines(resp, path, batch_s)) as lines:
                async for line in lines:
                    event, pruned = _decode("GET", path, line)
                    if pruned:
                        event = sift_event(event, f"GET {path}", plural_of(path),
                                           self.undecodable)
                    yield event
        except _Silent as exc:
            raise await self._timed_out(generation, f"GET {path}", read_timeout_s or 0) from exc
        finally:
            self._streams.discard(body)
            resp.response.close()  # a watch cut short: drop its connection

    async def _send(self, method: str, path: str, query: Query | None, body: Any,
                    content_type: str | None, timeout: aiohttp.ClientTimeout) -> RESTResponse:
        """Issue the request through the ApiClient (auth, TLS, pooling); the answer's
        body is not read yet. Transport failures become `Unavailable`."""
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        params = [(k, _query_value(v)) for k, v in (query or {}).items() if v is not None]
        try:
            # The body is JSON already (plain dicts and lists): the generated client's
            # deep walk over it (for its model classes) would only copy it.
            _, url, headers, _, _ = await self._client.param_serialize(
                method=method, resource_path=path, query_params=params,
                header_params=headers, auth_settings=_AUTH)
            return await self._client.call_api(method, url, header_params=headers, body=body,
                                               _request_timeout=timeout)
        except ApiException as exc:
            raise from_status(exc.status or 0, exc.body or "", http_reason=str(exc.reason)) \
                from exc
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise _unreachable(method, path, exc) from exc
        except (ConfigException, ValueError, TypeError) as exc:
            raise KubeError(f"{method} {path}: cannot build the request: {exc}",
                            reason="BadRequest") from exc

    # -- verbs ---------------------------------------------------------------------

    async def get(self, res: Resource, name: str, namespace: str | None = None) -> dict[str, Any]:
        return await self.request("GET", res.path(namespace, name))

    async def list(self, res: Resource, namespace: str | None = None, *,
                   label_selector: str | None = None, field_selector: str | None = None,
                   resource_version: str | None = None, limit: int | None = None,
                   continue_token: str | None = None) -> dict[str, Any]:
        """The List object (`items`, `metadata.resourceVersion`); all namespaces when
        `namespace` is None. With `limit`, one page of at most that many: its
        `metadata.continue` (absent on the last page) asks for the next one, passed
        back as `continue_token` (a token the server no longer serves: `Gone`)."""
        query = {"labelSelector": label_selector, "fieldSelector": field_selector,
                 "resourceVersion": resource_version, "limit": limit,
                 "continue": continue_token}
        return await self.request("GET", res.path(namespace), query=query)

    async def create(self, res: Resource, body: dict[str, Any],
                     namespace: str | None = None) -> dict[str, Any]:
        """POST `body`; the namespace defaults to the body's own `metadata.namespace`."""
        ns = namespace or _body_namespace(res, body)
        return await self.request("POST", res.path(ns), body=body)

    async def replace(self, res: Resource, name: str, body: dict[str, Any],
                      namespace: str | None = None, *,
                      subresource: str | None = None) -> dict[str, Any]:
        """PUT `body` (its resourceVersion makes it conditional: a stale one is Conflict)."""
        return await self.request("PUT", res.path(namespace, name, subresource), body=body)

    async def delete(self, res: Resource, name: str, namespace: str | None = None, *,
                     propagation: str | None = "Background",
                     grace_period_s: int | None = None) -> None:
        """Delete; an object that is already gone is not an error."""
        body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if propagation:
            body["propagationPolicy"] = propagation
        if grace_period_s is not None:
            body["gracePeriodSeconds"] = grace_period_s
        try:
            await self.request("DELETE", res.path(namespace, name), body=body)
        except KubeError as exc:
            if exc.status != 404:
                raise

    async def merge_patch(self, res: Resource, name: str, patch: dict[str, Any],
                          namespace: str | None = None, *,
                          subresource: str | None = None) -> dict[str, Any]:
        """RFC 7386 merge patch: maps merge, `None` removes a key, lists are replaced."""
        return await self._patch(res, name, patch, namespace, subresource, MERGE_PATCH)

    async def json_patch(self, res: Resource, name: str, ops: JsonPatch,
                         namespace: str | None = None, *,
                         subresource: str | None = None) -> dict[str, Any]:
        """RFC 6902 JSON patch; a failed `test` op raises `Invalid`."""
        return await self._patch(res, name, ops, namespace, subresource, JSON_PATCH)

    async def strategic_patch(self, res: Resource, name: str, patch: dict[str, Any],
                              namespace: str | None = None, *,
                              subresource: str | None = None) -> dict[str, Any]:
        """Strategic merge patch (built-in kinds only): lists such as `status.conditions`
        merge by their key, so one condition can be set without touching the others."""
        return await self._patch(res, name, patch, namespace, subresource, STRATEGIC_PATCH)

    async def _patch(self, res: Resource, name: str, body: Any, namespace: str | None,
                     subresource: str | None, content_type: str) -> dict[str, Any]:
        return await self.request("PATCH", res.path(namespace, name, subresource), body=body,
                                  content_type=content_type)


# -- helpers -------------------------------------------------------------------------


def _environment_once(api_client: ApiClient) -> None:
    """Read the proxy settings of the environment once, not on every request; keep
    no cookies.

    The generated client opens its aiohttp session with `trust_env=True`, which looks
    up ~/.netrc and the proxy variables in a worker thread for every request: two
    thread hand-offs each, a large part of a small request's cost. Credentials come
    from the kubeconfig or the service account, never from .netrc; the proxy for the
    API server (HTTPS_PROXY, NO_PROXY) does not change while the process runs, so it
    is resolved here and the per-request lookups are switched off.
    """
    rest = api_client.rest_client
    config = api_client.configuration
    if rest.pool_manager is not None:  # the session exists already: nothing to change
        return
    # Every pool the REST client builds (the first, and each after `drop_connections`)
    # gets sockets with TCP keepalive.
    rest._create_connector = lambda: _keepalive_connector(rest)
    # No cookie jar either, as client-go keeps none: filtering one costs every request.
    config.client_session_kwargs = {"trust_env": False, "cookie_jar": aiohttp.DummyCookieJar(),
                                    **(config.client_session_kwargs or {})}
    if rest.proxy is None:
        try:
            proxy, auth = get_env_proxy_for_url(URL(str(config.host)))
        except (LookupError, ValueError):
            return  # no proxy for this host
        rest.proxy = str(proxy)
        if auth is not None:
            rest.proxy_headers = {**(rest.proxy_headers or {}),
                                  "Proxy-Authorization": auth.encode()}


def _keepalive_connector(rest: Any) -> aiohttp.TCPConnector:
    """The REST client's own connector (pool size, TLS), its sockets with keepalive."""
    limit_per_host = getattr(rest.configuration, "tcp_connector_limit_per_host", None)
    return aiohttp.TCPConnector(limit=rest.maxsize, ssl=rest.ssl_context,
                                limit_per_host=limit_per_host or 0,
                                socket_factory=keepalive_socket)


def keepalive_socket(addr_info: tuple[Any, ...]) -> socket.socket:
    """A socket for `addr_info` (family, type, proto, ...) with TCP keepalive on."""
    family, kind, proto = addr_info[:3]
    sock = socket.socket(family=family, type=kind, proto=proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in _KEEPALIVE:
        if hasattr(socket, option):  # Linux names; other systems keep their defaults
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)
    return sock


def _query_value(value: str | int | bool) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _body_namespace(res: Resource, body: dict[str, Any]) -> str | None:
    if not res.namespaced:
        return None
    meta = body.get("metadata") if isinstance(body, dict) else None
    ns = meta.get("namespace") if isinstance(meta, dict) else None
    return str(ns) if ns else None


def _retry_after(resp: RESTResponse) -> float | None:
    try:
        return float(resp.headers.get("Retry-After", ""))
    except ValueError:
        return None


async def _read(resp: RESTResponse) -> bytes:
    """The whole body of a 2xx answer; the translated error for anything else."""
    try:
        raw = await resp.response.read()
    except (aiohttp.ClientError, OSError) as exc:
        raise _unreachable("read", str(resp.response.url.path), exc) from exc
    finally:
        resp.response.release()
    if resp.status >= 300:
        raise from_status(resp.status, raw, http_reason=str(resp.reason or ""),
                          retry_after=_retry_after(resp))
    return bytes(raw)


class _Silent(Exception):
    """A stream sent nothing for longer than its read timeout."""


async def _lines(resp: RESTResponse, path: str, batch_s: float = 0) -> AsyncGenerator[bytes, None]:
    """Complete non-empty lines of a streamed body, as they arrive (with `batch_s`,
    read no more often than that: `Kube.stream`); `_Silent` when nothing arrives
    within the read timeout."""
    pending = b""
    try:
        body = resp.response.content
        async for chunk in body.iter_any():
            if batch_s > 0:
                chunk += await _what_follows(resp, batch_s)
            pending += chunk + body.read_nowait()  # and whatever else came with it
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if line.strip():
                    yield line
            if len(pending) > _CHUNK_LIMIT:
                raise KubeError(f"GET {path}: a line over {_CHUNK_LIMIT} bytes",
                                reason="BadResponse")
    except TimeoutError as exc:  # aiohttp's sock_read: a timeout of its own kind
        raise _Silent() from exc
    except (aiohttp.ClientError, OSError) as exc:
        raise _unreachable("GET", path, exc) from exc
    if pending.strip():
        yield pending


async def _what_follows(resp: RESTResponse, seconds: float) -> bytes:
    """What arrives within `seconds` of what was just read, read at once: the
    connection is left unread meanwhile (as aiohttp's own flow control pauses it,
    its read timeout stopped), then read again (b"" when nothing came)."""
    connection = resp.response.connection
    protocol = connection.protocol if connection is not None else None
    if protocol is None or protocol.transport is None:
        return b""
    with _socket_unread(protocol.transport):
        protocol.pause_reading()
        try:
            await anyio.sleep(seconds)
        finally:
            if protocol.transport is not None:
                protocol.resume_reading()
    # What waited in the socket is read by the event loop's next turns.
    with anyio.move_on_after(_CATCH_UP_S):
        return bytes(await resp.response.content.readany())
    return b""


@contextlib.contextmanager
def _socket_unread(transport: asyncio.BaseTransport) -> Iterator[None]:
    """The socket under `transport` left unread for the block. A plain transport's
    pause_reading does that already; a TLS transport's only stops handing data up
    and goes on reading the socket, a wake-up per piece the server sends, until
    its read buffer is full: its buffer limit at 0 stops the socket at once."""
    limits = getattr(transport, "get_read_buffer_limits", None)
    if limits is None:
        yield
        return
    low, high = limits()
    transport.set_read_buffer_limits(high=0)  # type: ignore[attr-defined]
    try:
        yield
    finally:
        if not transport.is_closing():
            transport.set_read_buffer_limits(high=high, low=low)  # type: ignore[attr-defined]


def _decode(method: str, path: str, raw: bytes) -> tuple[dict[str, Any], bool]:
    """The answer's JSON object, and whether values nested too deep were cut from it
    (healthd.kube.decoding: the caller takes out the objects that carried them)."""
    if not raw.strip():
        return {}, False
    try:
        value, pruned = loads(raw)
    except (ValueError, RecursionError) as exc:
        # A proxy or load balancer answering HTML: the real server is not reachable.
        raise Unavailable(f"{method} {path}: the answer is not JSON: {raw[:120]!r}",
                          reason="BadResponse") from exc
    if not isinstance(value, dict):
        raise Unavailable(f"{method} {path}: the answer is not a JSON object",
                          reason="BadResponse")
    return value, pruned


def _unreachable(method: str, path: str, exc: BaseException) -> Unavailable:
    if isinstance(exc, TimeoutError):
        return Unavailable(f"{method} {path}: timed out", reason="Timeout")
    detail = str(exc) or type(exc).__name__
    return Unavailable(f"{method} {path}: {detail}", reason="Unreachable")


async def _from_file(path: str, config: Configuration,
                     context: str | None) -> None:
    _read_kubeconfig(path)
    await load_kube_config(
        config_file=path, context=context, client_configuration=config,
        persist_config=False)


def _read_kubeconfig(path: str) -> dict[str, Any]:
    """The kubeconfig file as a mapping; ConfigException saying plainly what is wrong
    (the client's own loader answers an empty file with a TypeError and broken YAML
    with a parser traceback, before it looks at anything else)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigException("not a text file") from exc
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" (line {where.line + 1})" if where is not None else ""
        raise ConfigException(f"not valid YAML{line}: "
                              f"{getattr(exc, 'problem', None) or exc}") from exc
    if document is None:
        raise ConfigException("the file is empty")
    if not isinstance(document, dict):
        raise ConfigException(f"not a YAML mapping (got {type(document).__name__})")
    return document


async def _load_configuration(kubeconfig: str | None,
                              context: str | None = None) -> Configuration:
    # Bypass the generated class's "default copy" construction: a fresh, private config.
    config: Configuration = type.__call__(Configuration)
    # $KUBECONFIG is the kubernetes client's own convention, honoured like kubectl does.
    path = kubeconfig or os.environ.get("KUBECONFIG")
    home = Path.home() / ".kube" / "config"
    try:
        if path:
            await _from_file(path, config, context)
            return config
        try:
            if context:  # a context names a kubeconfig entry: never the in-cluster account
                raise ConfigException(f"--context {context} needs a kubeconfig")
            load_incluster_config(
                client_configuration=config)
        except ConfigException:
            if not home.exists():
                raise
            await _from_file(str(home), config, context)
        return config
    except (ConfigException, OSError, ValueError, TypeError, KeyError) as exc:
        where = path or "in-cluster service account or ~/.kube/config"
        raise KubeError(f"no usable Kubernetes configuration ({where}): {exc}",
                        reason="NoConfig") from exc
