"""A ValidatingAdmissionPolicy evaluated the way the API server does, for tests.

The CEL runs on a real CEL implementation (PyPI `cel-expr-python`, the C++ runtime's
bindings) over plain JSON objects, as the API server's unstructured objects are:
`object`, `oldObject`, `request` and `variables`. A request is judged when every
matchCondition is true; it is denied when any validation is false or fails to
evaluate (failurePolicy Fail). Kubernetes' own CEL libraries (quantity, regex
helpers, ...) are not provided, and the policy does not need them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

cel = pytest.importorskip("cel_expr_python.cel", reason="cel-expr-python is not installed")

Obj = dict[str, Any]
INPUTS = ("object", "oldObject", "request", "params", "namespaceObject", "variables")
# What the API server keeps or checks itself before admission sees an update: a write
# that changes the resourceVersion is a conflict, the uid cannot change, the creation
# timestamp and generation are put back; `object` carries `oldObject`'s (a store's
# states before and after a write, as tests catch them, differ there).
SERVER_KEPT = ("uid", "creationTimestamp", "resourceVersion", "generation")


@dataclass(frozen=True)
class Verdict:
    judged: bool  # the policy's match conditions selected the request
    denials: tuple[str, ...]  # messages of the validations that refused it

    @property
    def allowed(self) -> bool:
        return not self.denials


class Policy:
    """One ValidatingAdmissionPolicy, compiled (a compile error fails at once)."""

    def __init__(self, policy: Obj) -> None:
        spec = policy["spec"]
        self.env = cel.NewEnv(variables={name: cel.Type.DYN for name in INPUTS})
        self.matches = [self.env.compile(c["expression"]) for c in spec.get("matchConditions", [])]
        self.variables = [(v["name"], self.env.compile(v["expression"]))
                          for v in spec.get("variables", [])]
        self.validations = [(self.env.compile(v["expression"]), v.get("message", v["expression"]))
                            for v in spec["validations"]]

    def _eval(self, expression: Any, data: Obj, *, plain: bool = False) -> Any:
        value = expression.eval(data=data)
        if value.type() == cel.Type.ERROR:
            raise ValueError("evaluation error")
        return value.plain_value() if plain else value.value()

    def review(self, *, old: Obj | None, new: Obj | None, user: str,
               extra: dict[str, list[str]] | None = None, operation: str = "UPDATE",
               namespace: str = "") -> Verdict:
        """`kind` and `namespace` of the request are the object's (`new`, else `old`)."""
        if operation == "UPDATE" and old is not None and new is not None:
            new = _as_admitted(old, new)
        subject = new or old or {}
        group, _, version = str(subject.get("apiVersion", "")).rpartition("/")
        request = {"operation": operation, "userInfo": {"username": user, "extra": extra or {}},
                   "kind": {"group": group, "version": version, "kind": subject.get("kind", "")},
                   "namespace": namespace}
        data: Obj = {"object": new, "oldObject": old, "request": request, "params": None,
                     "namespaceObject": None, "variables": {}}
        if not all(self._eval(m, data) is True for m in self.matches):
            return Verdict(False, ())
        for name, expression in self.variables:
            # plain Python values: a variable is input to the next expressions
            data["variables"][name] = self._eval(expression, data, plain=True)
        denials = []
        for expression, message in self.validations:
            try:
                ok = self._eval(expression, data) is True
            except ValueError:
                ok = False  # failurePolicy Fail: an error refuses the request
            if not ok:
                denials.append(message)
        return Verdict(True, tuple(denials))


def _as_admitted(old: Obj, new: Obj) -> Obj:
    """`new` as admission sees it: with `old`'s SERVER_KEPT metadata."""
    before = old.get("metadata") or {}
    metadata = {k: v for k, v in (new.get("metadata") or {}).items() if k not in SERVER_KEPT}
    metadata.update({k: before[k] for k in SERVER_KEPT if k in before})
    return {**new, "metadata": metadata}
