"""Server-side apply of manifests, as `kubectl apply --server-side` does, through the
official client's dynamic client (any kind, CRDs included)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import ResourceNotFoundError

FIELD_MANAGER = "healthd-tests"
Obj = dict[str, Any]


def api_client(kubeconfig: Path) -> k8s.ApiClient:
    return k8s_config.new_client_from_config(config_file=str(kubeconfig))


def documents(text: str) -> list[Obj]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def load(path: Path) -> list[Obj]:
    return documents(path.read_text())


class Applier:
    """Applies manifests with one identity; waits for new kinds (CRDs) to be served."""

    def __init__(self, client: k8s.ApiClient) -> None:
        self.client = client
        self.dynamic = DynamicClient(client)

    def resource(self, obj: Obj, timeout_s: float = 60.0) -> Any:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return self.dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
            except ResourceNotFoundError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
                self.dynamic.resources.invalidate_cache()

    def apply(self, objs: Iterable[Obj], *, dry_run: bool = False) -> list[Obj]:
        applied = []
        for obj in objs:
            resource = self.resource(obj)
            meta = obj["metadata"]
            kwargs: dict[str, Any] = {"field_manager": FIELD_MANAGER, "force_conflicts": True}
            if dry_run:
                kwargs["dry_run"] = "All"
            if resource.namespaced:
                kwargs["namespace"] = meta.get("namespace", "default")
            answer = resource.server_side_apply(body=obj, name=meta["name"], **kwargs)
            applied.append(answer.to_dict())
        return applied

    def delete(self, objs: Iterable[Obj]) -> None:
        for obj in objs:
            resource = self.resource(obj)
            meta = obj["metadata"]
            kwargs = {"namespace": meta.get("namespace", "default")} if resource.namespaced else {}
            try:
                resource.delete(name=meta["name"], **kwargs)
            except k8s.ApiException as exc:
                if exc.status != 404:
                    raise

    def wait_established(self, crd_names: Iterable[str], timeout_s: float = 60.0) -> None:
        api = k8s.ApiextensionsV1Api(self.client)
        deadline = time.monotonic() + timeout_s
        for name in crd_names:
            while True:
                crd = api.read_custom_resource_definition(name)
                conditions = {c.type: c.status for c in (crd.status.conditions or [])}
                if conditions.get("Established") == "True":
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"CRD {name} not established within {timeout_s} s")
                time.sleep(0.3)
        self.dynamic.resources.invalidate_cache()
