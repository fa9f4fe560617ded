"""How clients find the emulator: a kubeconfig file and ready-made client objects.

The emulator has no TLS and trusts the bearer token as the user name, so the
kubeconfig is a plain `http://` server plus a token; `kubectl`, the official client
and anything else that reads kubeconfig files can use it.
"""

from __future__ import annotations

from pathlib import Path

import kubernetes.aio.client as aio_client
import kubernetes.client as sync_client
import yaml

CONTEXT = "healthd-emulator"
DEFAULT_USER = "admin"


def kubeconfig_dict(url: str, user: str = DEFAULT_USER) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": CONTEXT, "cluster": {"server": url}}],
        "users": [{"name": user, "user": {"token": user}}],
        "contexts": [{"name": CONTEXT, "context": {"cluster": CONTEXT, "user": user}}],
        "current-context": CONTEXT,
        "preferences": {},
    }


def write_kubeconfig(path: str | Path, url: str, user: str = DEFAULT_USER) -> Path:
    """Write a kubeconfig for `url` acting as `user`; return the path."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(yaml.safe_dump(kubeconfig_dict(url, user), sort_keys=False))
    return target


def sync_api_client(url: str, user: str = DEFAULT_USER) -> sync_client.ApiClient:
    """A `kubernetes.client.ApiClient` for the emulator (close it when done)."""
    config = sync_client.Configuration(host=url)
    config.api_key = {"authorization": f"Bearer {user}"}
    return sync_client.ApiClient(config)


def async_api_client(url: str, user: str = DEFAULT_USER) -> aio_client.ApiClient:
    """A `kubernetes.aio.client.ApiClient` for the emulator (close it, or `async with`)."""
    config = aio_client.Configuration(host=url)
    config.api_key = {"authorization": f"Bearer {user}"}
    return aio_client.ApiClient(config)
