"""The three PATCH flavours the official client sends, applied like the real server.

- merge patch (RFC 7386, `application/merge-patch+json`): maps merge, `null` deletes,
  lists are replaced;
- JSON patch (RFC 6902, `application/json-patch+json`): a failing `test` or a missing
  path is 422 Invalid, an undecodable patch is 400;
- strategic merge patch (`application/strategic-merge-patch+json`, built-in kinds
  only; custom resources answer 415): a merge patch except for the lists whose Go
  types carry `patchStrategy:"merge"`, which merge item by item on their
  `patchMergeKey`. Taints and tolerations have no such tag: they are replaced whole.
  The `$patch: delete|replace` directives work; other `$` directives are dropped.
"""

from __future__ import annotations

from typing import Any

import jsonpatch

from healthd.sim.apiserver.errors import ApiError
from healthd.sim.apiserver.resources import copy_json

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"

_CONTAINER_LISTS = {"env": "name", "ports": "containerPort", "volumeMounts": "mountPath"}
_POD_SPEC_LISTS = {"containers": "name", "initContainers": "name",
                   "ephemeralContainers": "name", "volumes": "name"}
_PRIMITIVE_SET = object()  # lists of scalars merged as a set (finalizers)


def _merge_keys() -> dict[tuple[str, ...], Any]:
    """Field path (list items skipped) -> merge key, from the Kubernetes Go types."""
    keys: dict[tuple[str, ...], Any] = {
        ("metadata", "finalizers"): _PRIMITIVE_SET,
        ("metadata", "ownerReferences"): "uid",
        ("status", "conditions"): "type",
        ("status", "addresses"): "type",
    }
    for prefix in (("spec",), ("spec", "template", "spec")):
        for name, key in _POD_SPEC_LISTS.items():
            keys[(*prefix, name)] = key
            if name.endswith("ontainers"):
                for sub, sub_key in _CONTAINER_LISTS.items():
                    keys[(*prefix, name, sub)] = sub_key
    return keys


MERGE_KEYS = _merge_keys()


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: returns the patched copy."""
    if not isinstance(patch, dict):
        return copy_json(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def json_patch(target: Any, ops: Any) -> Any:
    """RFC 6902 with the real server's status codes."""
    if not isinstance(ops, list):
        raise ApiError.bad_request("a JSON patch must be a list of operations")
    try:
        jsonpatch.JsonPatch(ops)  # every operation well-formed before any applies
    except (jsonpatch.InvalidJsonPatch, TypeError, KeyError) as exc:
        raise ApiError.bad_request(f"invalid JSON patch: {exc}") from exc
    try:
        return _apply(ops, copy_json(target))
    except jsonpatch.JsonPatchTestFailed as exc:
        raise ApiError.invalid(f"the server rejected our request due to an error in our "
                               f"request: testing value failed: {exc}") from exc
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException, TypeError,
            KeyError, IndexError) as exc:
        raise ApiError.invalid(f"the server rejected our request due to an error in our "
                               f"request: {exc}") from exc


def _apply(ops: list[Any], doc: Any) -> Any:
    """`ops` applied as the real server's JSON-patch library does, where it differs
    from RFC 6902: a `test` of `null` on an absent member of an existing object passes
    (that library reads the absent member as null)."""
    for raw in ops:
        if isinstance(raw, dict) and raw.get("op") == "test" and "value" in raw \
                and raw["value"] is None:
            parent, key = jsonpatch.JsonPointer(raw.get("path", "")).to_last(doc)
            if isinstance(parent, dict) and key not in parent:
                continue
        doc = jsonpatch.JsonPatch([raw]).apply(doc, in_place=True)
    return doc


def _strip_directives(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_directives(v) for k, v in value.items() if not k.startswith("$")}
    if isinstance(value, list):
        return [_strip_directives(v) for v in value]
    return value


def _merge_list_by_key(target: list[Any], patch: list[Any], key: str,
                       path: tuple[str, ...]) -> list[Any]:
    out = [copy_json(item) for item in target]
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            raise ApiError.bad_request(f"{'.'.join(path)}: item {item!r} lacks merge key {key}")
        if item.get("$patch") == "replace":
            return [_strip_directives(i) for i in patch if i.get("$patch") != "replace"]
        index = next((i for i, old in enumerate(out)
                      if isinstance(old, dict) and old.get(key) == item[key]), None)
        if item.get("$patch") == "delete":
            if index is not None:
                del out[index]
        elif index is None:
            out.append(_strip_directives(item))
        else:
            out[index] = strategic_merge(out[index], item, path)
    return _real_order(out, [i[key] for i in patch if i.get("$patch") != "delete"],
                       [i.get(key) for i in target if isinstance(i, dict)], key)


def _real_order(merged: list[Any], patched: list[Any], server: list[Any],
                key: str) -> list[Any]:
    """The real server's order (strategicpatch's normalizeElementOrder): patched items
    in the patch's order, each server-only item placed before the first patched item
    it precedes on the server. A new condition thus comes before the old ones."""
    mine = sorted((i for i in merged if i.get(key) in patched),
                  key=lambda i: patched.index(i[key]))
    theirs = [i for i in merged if i.get(key) not in patched]
    where = {k: n for n, k in enumerate(server)}
    out: list[Any] = []
    while theirs or mine:
        first_theirs = bool(theirs) and (not mine or where.get(mine[0][key], -1) >
                                          where[theirs[0][key]] >= 0)
        out.append((theirs if first_theirs else mine).pop(0))
    return out


def _merge_list(target: Any, patch: list[Any], path: tuple[str, ...]) -> list[Any]:
    key = MERGE_KEYS.get(path)
    if key is None or not isinstance(target, list):
        return [_strip_directives(item) for item in patch]
    if key is _PRIMITIVE_SET:
        return list(target) + [v for v in patch if v not in target]
    return _merge_list_by_key(target, patch, key, path)


def strategic_merge(target: Any, patch: Any, path: tuple[str, ...] = ()) -> Any:
    """A strategic merge patch on a built-in object: returns the patched copy."""
    if isinstance(patch, list):
        return _merge_list(target, patch, path)
    if not isinstance(patch, dict):
        return copy_json(patch)
    if patch.get("$patch") == "replace":
        return _strip_directives(patch)
    if patch.get("$patch") == "delete":
        return None
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            out[field] = [v for v in out.get(field) or [] if v not in value]
        elif key.startswith("$"):
            continue
        elif value is None:
            out.pop(key, None)
        else:
            merged = strategic_merge(out.get(key), value, (*path, key))
            if merged is None:
                out.pop(key, None)
            else:
                out[key] = merged
    return out


def apply_patch(target: dict[str, Any], content_type: str, patch: Any, *,
                custom: bool) -> dict[str, Any]:
    """Patch `target` (in the shape the client sees) by the request's content type."""
    kind = content_type.split(";")[0].strip().lower()
    if kind == JSON_PATCH:
        result = json_patch(target, patch)
    elif kind in (MERGE_PATCH, APPLY_PATCH):
        result = merge_patch(target, patch)
    elif kind == STRATEGIC_PATCH and not custom:
        result = strategic_merge(target, patch)
    else:
        raise ApiError(415, f"the body of the request was in an unknown format - accepted "
                       f"media types include: {JSON_PATCH}, {MERGE_PATCH}"
                       + ("" if custom else f", {STRATEGIC_PATCH}"))
    if not isinstance(result, dict):
        raise ApiError.bad_request("the patch did not produce an object")
    return result
