"""Objects nested thousands of levels deep, as JSON text (Python's own encoder and
decoder stop near 1,000 levels; the API server stores up to 10,000), and a way to
create one over plain HTTP on the emulator."""

from __future__ import annotations

import json
from typing import Any

import aiohttp

LEVELS = 3000
MARK = "@deep@"


def nested(levels: int = LEVELS) -> str:
    """A JSON value `levels` objects deep."""
    return '{"x":' * levels + "1" + "}" * levels


def with_deep_value(obj: dict[str, Any], levels: int = LEVELS) -> str:
    """`obj` as JSON text, its value `MARK` replaced by a value `levels` deep."""
    return json.dumps(obj).replace(json.dumps(MARK), nested(levels))


def deep_pod(name: str, namespace: str = "default", levels: int = LEVELS) -> str:
    return with_deep_value({"apiVersion": "v1", "kind": "Pod",
                            "metadata": {"name": name, "namespace": namespace},
                            "spec": {"containers": [{"name": "c", "image": "pause"}],
                                     "extra": MARK}}, levels)


def deep_appwrapper(name: str, namespace: str, levels: int = LEVELS) -> str:
    """An AppWrapper whose component template (free-form by the CRD) nests `levels`
    deep."""
    template = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
                "nested": MARK}
    return with_deep_value({
        "apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"suspend": True, "components": [{"template": template}]}}, levels)


async def post(url: str, path: str, text: str, *, method: str = "POST") -> int:
    """Send `text` as it is (no client re-encodes it) to the emulator at `url`."""
    async with aiohttp.ClientSession() as session, session.request(
            method, url + path, data=text.encode(),
            headers={"Content-Type": "application/json",
                     "Authorization": "Bearer admin"}) as resp:
        await resp.read()
        return resp.status
