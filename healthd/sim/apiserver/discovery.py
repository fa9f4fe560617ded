"""Discovery documents: `/version`, `/api`, `/api/v1`, `/apis`, `/apis/<group>[/<version>]`.

Built from the resource table, so a group/version switched off disappears here and
clients that discover (the dynamic client, kubectl) see what a cluster without it
would show.
"""

from __future__ import annotations

from typing import Any

from healthd.sim.apiserver.resources import ResourceTable, ResourceType

VERSION_INFO = {
    "major": "1",
    "minor": "34",
    "gitVersion": "v1.34.0-healthd-emulator",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "go1.24.0",
    "compiler": "gc",
    "platform": "linux/amd64",
}

_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


def api_versions(server_address: str) -> dict[str, Any]:
    return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
        {"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}]}


def _group(name: str, versions: list[str]) -> dict[str, Any]:
    entries = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
    return {"name": name, "versions": entries, "preferredVersion": entries[0]}


def api_group_list(table: ResourceTable) -> dict[str, Any]:
    groups = [_group(g, vs) for g, vs in table.group_versions().items() if g]
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def api_group(table: ResourceTable, group: str) -> dict[str, Any] | None:
    versions = table.group_versions().get(group)
    if not group or not versions:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group(group, versions)}


def _entries(rt: ResourceType) -> list[dict[str, Any]]:
    main = {"name": rt.plural, "singularName": rt.kind.lower(), "namespaced": rt.namespaced,
            "kind": rt.kind, "verbs": _VERBS, "shortNames": list(rt.short_names)}
    if not rt.status:
        return [main]
    status = {"name": f"{rt.plural}/status", "singularName": "", "namespaced": rt.namespaced,
              "kind": rt.kind, "verbs": ["get", "patch", "update"]}
    return [main, status]


def api_resource_list(table: ResourceTable, group: str, version: str) -> dict[str, Any] | None:
    served = [rt for rt in table.served() if (rt.group, rt.version) == (group, version)]
    if not served:
        return None
    group_version = served[0].group_version
    resources = [entry for rt in served for entry in _entries(rt)]
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version,
            "resources": resources}
