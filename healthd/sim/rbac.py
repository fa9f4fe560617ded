"""Kubernetes RBAC for the API emulator: who may do what, and which rules were needed.

`RbacAuthorizer` reads Roles, ClusterRoles and their bindings from manifests (the
rendered `deploy/` objects) and answers the emulator's authorizer question with the
semantics of the real RBAC authorizer:

- a ClusterRoleBinding grants its ClusterRole everywhere (cluster-scoped objects and
  every namespace); a RoleBinding grants its Role, or a ClusterRole, only inside the
  binding's namespace and never for cluster-scoped objects;
- a rule matches when the verb, the API group and the resource match (`*` matches
  all; a subresource is asked for as `nodes/status`, matched exactly or by
  `*/status`) and, when it names `resourceNames`, the request names one of them
  (a create or a list names nothing, so such a rule never allows them);
- subjects are ServiceAccounts (user `system:serviceaccount:NS:NAME`), Users and
  Groups (`system:serviceaccounts`, `system:serviceaccounts:NS`,
  `system:authenticated`); a binding to a missing role grants nothing.

It also keeps the books a least-privilege test needs: every denied request, and
which rule entry (verb x group x resource) decided each allowed one. Bindings are
consulted in a fixed order (ClusterRoleBindings, then RoleBindings, each by name) and
the first rule that allows a request is credited, so a rule that only repeats what
another already grants shows up as unused.

Usage::

    authz = RbacAuthorizer.from_manifests(objects)
    api.authorizer = authz
    ...  # run the agent as system:serviceaccount:healthd-system:healthd-agent
    assert authz.denied == [] and authz.unused() == []

Not modelled: aggregated ClusterRoles (`aggregationRule`), non-resource URLs (the
emulator serves discovery to everyone, as `system:discovery` does), impersonation,
and the apiserver's trick of authorizing a list/watch with a `metadata.name` field
selector as a request for that name (the emulator does not pass selectors here).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

SUPERUSERS = frozenset({"admin"})  # the emulator's default user: tests and fakes act as it
_ALL = "*"

Entry = tuple[str, str, str]  # (verb, apiGroup, resource) as written in a rule


@dataclass(frozen=True)
class Request:
    """One authorization question, as the emulator asks it."""

    user: str
    verb: str
    group: str
    resource: str
    subresource: str
    namespace: str | None
    name: str | None

    @property
    def combined(self) -> str:
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource

    def __str__(self) -> str:
        where = f" in {self.namespace}" if self.namespace else ""
        name = f" {self.name}" if self.name else ""
        group = self.group or "core"
        return f"{self.user}: {self.verb} {group}/{self.combined}{name}{where}"


@dataclass(frozen=True)
class Rule:
    """One PolicyRule."""

    verbs: tuple[str, ...]
    api_groups: tuple[str, ...]
    resources: tuple[str, ...]
    resource_names: tuple[str, ...]

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> Rule:
        def strings(key: str) -> tuple[str, ...]:
            value = raw.get(key) or []
            return tuple(str(v) for v in value) if isinstance(value, list) else ()

        return cls(strings("verbs"), strings("apiGroups"), strings("resources"),
                   strings("resourceNames"))

    def match(self, req: Request) -> Entry | None:
        """The (verb, group, resource) entries that allow `req`, or None."""
        verb = _pick(self.verbs, req.verb)
        group = _pick(self.api_groups, req.group)
        resource = _resource_entry(self.resources, req.combined, req.subresource)
        if verb is None or group is None or resource is None:
            return None
        if self.resource_names and req.name not in self.resource_names:
            return None
        return verb, group, resource

    def entries(self) -> list[Entry]:
        """Every verb x group x resource this rule grants, as written."""
        return [(v, g, r) for v in self.verbs for g in self.api_groups for r in self.resources]


def _pick(allowed: tuple[str, ...], wanted: str) -> str | None:
    if wanted in allowed:
        return wanted
    return _ALL if _ALL in allowed else None


def _resource_entry(allowed: tuple[str, ...], combined: str, subresource: str) -> str | None:
    """As rbac's ResourceMatches: exact, `*`, or `*/<subresource>`."""
    if combined in allowed:
        return combined
    if subresource and f"*/{subresource}" in allowed:
        return f"*/{subresource}"
    return _ALL if _ALL in allowed else None


@dataclass(frozen=True)
class RoleId:
    kind: str  # Role or ClusterRole
    name: str
    namespace: str = ""  # a Role's namespace

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}" if self.namespace else \
            f"{self.kind} {self.name}"


@dataclass(frozen=True)
class Binding:
    """A (Cluster)RoleBinding: `namespace` is None for a ClusterRoleBinding."""

    name: str
    namespace: str | None
    role: RoleId
    users: frozenset[str]
    groups: frozenset[str]

    def grants_to(self, user: str, groups: frozenset[str]) -> bool:
        return user in self.users or bool(self.groups & groups)

    def covers(self, req: Request) -> bool:
        """Whether the binding's scope includes the request's object: a RoleBinding
        only its namespace (cluster-scoped objects and cluster-wide lists carry none)."""
        return self.namespace is None or req.namespace == self.namespace


def user_groups(user: str) -> frozenset[str]:
    """The groups the API server puts a user in (service accounts get three)."""
    groups = {"system:authenticated"}
    parts = user.split(":")
    if len(parts) == 4 and parts[:2] == ["system", "serviceaccount"]:
        groups |= {"system:serviceaccounts", f"system:serviceaccounts:{parts[2]}"}
    return frozenset(groups)


def _subjects(raw: Mapping[str, Any], namespace: str | None) -> tuple[set[str], set[str]]:
    users: set[str] = set()
    groups: set[str] = set()
    for subject in raw.get("subjects") or []:
        kind, name = subject.get("kind"), str(subject.get("name") or "")
        if kind == "ServiceAccount":
            users.add(f"system:serviceaccount:{subject.get('namespace') or namespace}:{name}")
        elif kind == "User":
            users.add(name)
        elif kind == "Group":
            groups.add(name)
    return users, groups


def _binding(obj: Mapping[str, Any]) -> Binding:
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace") if obj["kind"] == "RoleBinding" else None
    ref = obj.get("roleRef") or {}
    role_ns = namespace if ref.get("kind") == "Role" else ""
    users, groups = _subjects(obj, namespace)
    return Binding(str(meta.get("name") or ""), namespace,
                   RoleId(str(ref.get("kind") or ""), str(ref.get("name") or ""), role_ns or ""),
                   frozenset(users), frozenset(groups))


def _role_id(obj: Mapping[str, Any]) -> RoleId:
    meta = obj.get("metadata") or {}
    namespace = str(meta.get("namespace") or "") if obj["kind"] == "Role" else ""
    return RoleId(str(obj["kind"]), str(meta.get("name") or ""), namespace)


class RbacAuthorizer:
    """An `Authorizer` for the emulator with real RBAC semantics (module docstring).
    `superusers` skip RBAC (the tests' own client and the fakes act as one)."""

    def __init__(self, roles: Mapping[RoleId, list[Rule]], bindings: Iterable[Binding], *,
                 superusers: Iterable[str] = SUPERUSERS) -> None:
        self.roles = dict(roles)
        self.bindings = sorted(bindings, key=lambda b: (b.namespace is not None,
                                                        b.namespace or "", b.name))
        self.superusers = frozenset(superusers)
        self.denied: list[Request] = []
        self.allowed: list[Request] = []
        self.used: set[tuple[RoleId, int, Entry]] = set()

    @classmethod
    def from_manifests(cls, objects: Iterable[Mapping[str, Any]], **kwargs: Any) -> RbacAuthorizer:
        """From rendered manifests; objects of other kinds are ignored."""
        roles: dict[RoleId, list[Rule]] = {}
        bindings: list[Binding] = []
        for obj in objects:
            kind = obj.get("kind")
            if kind in ("Role", "ClusterRole"):
                roles[_role_id(obj)] = [Rule.parse(r) for r in obj.get("rules") or []]
            elif kind in ("RoleBinding", "ClusterRoleBinding"):
                bindings.append(_binding(obj))
        return cls(roles, bindings, **kwargs)

    # -- the emulator's question ---------------------------------------------------

    def __call__(self, user: str, verb: str, group: str, resource: str, subresource: str,
                 namespace: str | None, name: str | None) -> bool:
        req = Request(user, verb, group, resource, subresource, namespace, name)
        if user in self.superusers:
            return True
        credit = self.decide(req)
        if credit is None:
            self.denied.append(req)
            return False
        self.allowed.append(req)
        self.used.add(credit)
        return True

    def decide(self, req: Request) -> tuple[RoleId, int, Entry] | None:
        """The first (role, rule index, entry) that allows `req`; None: denied."""
        groups = user_groups(req.user)
        for binding in self.bindings:
            if not binding.grants_to(req.user, groups) or not binding.covers(req):
                continue
            for index, rule in enumerate(self.roles.get(binding.role, [])):
                entry = rule.match(req)
                if entry is not None:
                    return binding.role, index, entry
        return None

    def allows(self, user: str, verb: str, group: str, resource: str, *, subresource: str = "",
               namespace: str | None = None, name: str | None = None) -> bool:
        """Ask without keeping books (for tests of the rules themselves)."""
        req = Request(user, verb, group, resource, subresource, namespace, name)
        return user in self.superusers or self.decide(req) is not None

    # -- the books -----------------------------------------------------------------

    def bound_roles(self, subject: str | None = None) -> list[RoleId]:
        """Roles some binding grants (to the user `subject`, when given), in order."""
        out: list[RoleId] = []
        for binding in self.bindings:
            if subject is not None and not binding.grants_to(subject, user_groups(subject)):
                continue
            if binding.role not in out:
                out.append(binding.role)
        return out

    def unused(self, subject: str | None = None, *,
               roles: Iterable[RoleId] | None = None) -> list[str]:
        """Every rule entry of a bound role (granted to `subject`, among `roles`, when
        given) that decided no request, one line each; bindings to missing roles; and,
        without a subject, roles that no binding grants."""
        chosen = [r for r in self.bound_roles(subject) if roles is None or r in set(roles)]
        lines = [f"{role}: bound but missing" for role in chosen if role not in self.roles]
        for role in chosen:
            for index, rule in enumerate(self.roles.get(role, [])):
                lines += [f"{role} rule {index}: {verb} {group or 'core'}/{resource} never used"
                          for verb, group, resource in rule.entries()
                          if (role, index, (verb, group, resource)) not in self.used]
        if subject is None and roles is None:
            bound = set(self.bound_roles())
            lines += [f"{role}: not bound to anyone" for role in self.roles if role not in bound]
        return lines

