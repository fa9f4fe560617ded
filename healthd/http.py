"""HTTP serving for the daemons (agent and controller): `/metrics`, `/healthz` and
`/readyz`, read-only.

- `GET /metrics`: the registry in Prometheus text format (or OpenMetrics when the
  scraper asks for it in `Accept`), with the matching content type;
- `GET /healthz`: 200 `ok` while the agent is alive, else 503 with the reason;
- `GET /readyz`: 200 `ok` once the agent is ready (first round done, API reachable
  or writes buffered), else 503 with the reason.

Any other path is 404 and any other method 405. No endpoint changes anything: the
on-demand checks go through Node annotations, where Kubernetes RBAC decides who may
ask. A probe callback that raises answers 503 with the error; it never takes the
server down.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

log = logging.getLogger(__name__)

Probe = Callable[[], tuple[bool, str]]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _metrics_handler(registry: CollectorRegistry) -> Handler:
    async def metrics(request: web.Request) -> web.Response:
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        try:
            body = encoder(registry)
        except Exception as exc:  # a broken collector must not take the endpoint down
            log.exception("metrics: a collector failed")
            return web.Response(status=500, text=f"cannot collect metrics: {exc}\n")
        return web.Response(body=body, headers={"Content-Type": content_type})

    return metrics


def _probe_handler(name: str, probe: Probe) -> Handler:
    async def answer(request: web.Request) -> web.Response:
        try:
            ok, reason = probe()
        except Exception as exc:
            log.exception("%s: the probe failed", name)
            ok, reason = False, f"{name} probe failed: {type(exc).__name__}: {exc}"
        if ok:
            return web.Response(text="ok\n")
        return web.Response(status=503, text=f"{reason or f'not {name}'}\n")

    return answer


def build_app(registry: CollectorRegistry, *, healthy: Probe, ready: Probe) -> web.Application:
    """The aiohttp application (GET and HEAD only; aiohttp answers 404 and 405)."""
    app = web.Application()
    app.router.add_get("/metrics", _metrics_handler(registry))
    app.router.add_get("/healthz", _probe_handler("healthy", healthy))
    app.router.add_get("/readyz", _probe_handler("ready", ready))
    return app


@asynccontextmanager
async def serve_http(
    port: int,
    registry: CollectorRegistry,
    *,
    healthy: Probe,
    ready: Probe,
    host: str = "0.0.0.0",
) -> AsyncIterator[int]:
    """Serve the endpoints on host:port while the context is open; yields the bound
    port (port 0 picks a free one). A port that cannot be bound raises OSError with a
    message naming the address."""
    app = build_app(registry, healthy=healthy, ready=ready)
    # A scrape in flight must not hold up the agent's 10 s stop.
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        try:
            await site.start()
        except OSError as exc:
            raise OSError(exc.errno, f"cannot serve HTTP on {host}:{port}: {exc.strerror}") from exc
        yield _bound_port(runner, port)
    finally:
        await runner.cleanup()


def _bound_port(runner: web.AppRunner, default: int) -> int:
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            return int(address[1])
    return default
