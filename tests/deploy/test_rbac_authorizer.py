"""The emulator's RBAC authorizer follows Kubernetes RBAC: scopes of Role vs
ClusterRole bindings, verbs, groups, subresources, resourceNames, wildcards,
subjects; it refuses through the real API (403) and keeps the books that the
least-privilege tests read (denials, unused rule entries)."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.aio.client import CoreV1Api
from kubernetes.aio.client.exceptions import ApiException

from healthd.sim.apiserver import ApiEmulator
from healthd.sim.rbac import RbacAuthorizer, RoleId, user_groups

SA = "system:serviceaccount:team:robot"
OTHER = "system:serviceaccount:team:other"


def role(kind: str, name: str, rules: list[dict[str, Any]], namespace: str = "") -> dict:
    meta = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": meta,
            "rules": rules}


def binding(kind: str, name: str, role_kind: str, role_name: str, subjects: list[dict],
            namespace: str = "") -> dict:
    meta = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind,
                        "name": role_name}, "subjects": subjects}


ROBOT = [{"kind": "ServiceAccount", "name": "robot", "namespace": "team"}]
MANIFESTS = [
    role("ClusterRole", "reader", [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list"]},
        {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
    ]),
    binding("ClusterRoleBinding", "reader", "ClusterRole", "reader", ROBOT),
    role("Role", "jobs", [
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create", "delete"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
         "resourceNames": ["mine"], "verbs": ["get", "update"]},
    ], namespace="team"),
    binding("RoleBinding", "jobs", "Role", "jobs", ROBOT, namespace="team"),
    # A ClusterRole bound by a RoleBinding grants only inside that namespace.
    role("ClusterRole", "pod-watcher", [
        {"apiGroups": ["*"], "resources": ["pods", "*/log"], "verbs": ["*"]}]),
    binding("RoleBinding", "pods", "ClusterRole", "pod-watcher",
            [{"kind": "Group", "name": "system:serviceaccounts:team"}], namespace="team"),
    role("ClusterRole", "unbound", [{"apiGroups": [""], "resources": ["secrets"],
                                     "verbs": ["get"]}]),
    binding("ClusterRoleBinding", "ghost", "ClusterRole", "missing",
            [{"kind": "User", "name": "alice"}]),
]


@pytest.fixture
def authz() -> RbacAuthorizer:
    return RbacAuthorizer.from_manifests(MANIFESTS)


CASES = [
    # (user, verb, group, resource, subresource, namespace, name, allowed)
    (SA, "get", "", "nodes", "", None, "n1", True),
    (SA, "list", "", "nodes", "", None, None, True),
    (SA, "watch", "", "nodes", "", None, None, False),  # verb not granted
    (SA, "patch", "", "nodes", "", None, "n1", False),  # only the subresource
    (SA, "patch", "", "nodes", "status", None, "n1", True),
    (SA, "get", "", "nodes", "status", None, "n1", False),
    (SA, "create", "batch", "jobs", "", "team", None, True),
    (SA, "create", "batch", "jobs", "", "other", None, False),  # Role: its namespace only
    (SA, "create", "", "jobs", "", "team", None, False),  # wrong API group
    (SA, "get", "coordination.k8s.io", "leases", "", "team", "mine", True),
    (SA, "get", "coordination.k8s.io", "leases", "", "team", "theirs", False),
    (SA, "list", "coordination.k8s.io", "leases", "", "team", None, False),  # names nothing
    (SA, "deletecollection", "", "pods", "", "team", None, True),  # group: *, verb: *
    (SA, "get", "", "pods", "log", "team", "p", True),  # */log
    (SA, "get", "", "pods", "exec", "team", "p", False),
    (SA, "list", "", "pods", "", None, None, False),  # cluster-wide: outside the binding
    (OTHER, "get", "", "pods", "", "team", "p", True),  # through its group
    (OTHER, "get", "", "nodes", "", None, "n1", False),
    ("alice", "get", "", "nodes", "", None, "n1", False),  # bound to a missing role
    ("admin", "delete", "", "nodes", "", None, "n1", True),  # the emulator's superuser
]


@pytest.mark.parametrize(("user", "verb", "group", "resource", "sub", "ns", "name", "allowed"),
                         CASES)
def test_rbac_semantics(authz: RbacAuthorizer, user: str, verb: str, group: str, resource: str,
                        sub: str, ns: str | None, name: str | None, allowed: bool) -> None:
    assert authz(user, verb, group, resource, sub, ns, name) is allowed


def test_service_accounts_are_in_their_groups() -> None:
    assert user_groups(SA) == {"system:authenticated", "system:serviceaccounts",
                               "system:serviceaccounts:team"}
    assert user_groups("alice") == {"system:authenticated"}


def test_the_books_name_denials_and_every_unused_rule_entry(authz: RbacAuthorizer) -> None:
    authz(SA, "get", "", "nodes", "", None, "n1")
    authz(SA, "watch", "", "nodes", "", None, None)
    authz(SA, "create", "batch", "jobs", "", "team", None)
    assert [str(r) for r in authz.denied] == ["system:serviceaccount:team:robot: watch core/nodes"]
    unused = authz.unused(SA, roles=[RoleId("ClusterRole", "reader"),
                                     RoleId("Role", "jobs", "team")])
    assert unused == [
        "ClusterRole reader rule 0: list core/nodes never used",
        "ClusterRole reader rule 1: patch core/nodes/status never used",
        "Role team/jobs rule 0: delete batch/jobs never used",
        "Role team/jobs rule 1: get coordination.k8s.io/leases never used",
        "Role team/jobs rule 1: update coordination.k8s.io/leases never used",
    ]
    everything = authz.unused()
    assert "ClusterRole unbound: not bound to anyone" in everything
    assert "ClusterRole missing: bound but missing" in everything


def test_a_rule_that_repeats_another_is_reported_unused() -> None:
    twice = [*MANIFESTS, role("Role", "again", [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}], namespace="team"),
        binding("RoleBinding", "again", "Role", "again", ROBOT, namespace="team")]
    authz = RbacAuthorizer.from_manifests(twice)
    assert authz(SA, "get", "", "nodes", "", None, "n1")
    assert "Role team/again rule 0: get core/nodes never used" in authz.unused(SA)


@pytest.mark.anyio
async def test_the_emulator_refuses_with_403(api: ApiEmulator, authz: RbacAuthorizer) -> None:
    api.seed({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})
    api.authorizer = authz
    async with api.async_client(user=SA) as client:
        core = CoreV1Api(client)
        assert (await core.read_node("n1")).metadata.name == "n1"
        with pytest.raises(ApiException) as refused:
            await core.delete_node("n1")
    assert refused.value.status == 403
    assert api.get("Node", "n1") is not None
    assert [str(r) for r in authz.denied] == [
        "system:serviceaccount:team:robot: delete core/nodes n1"]
