"""The admission policy's table of cases (tests/deploy/node_policy_cases.py), replayed
on the real API server: each case's Node is registered as `old`, the DaemonSet gives it
an agent Pod, and the agent, with a token bound to that Pod, updates the Node to `new`
(metadata and spec through the Node, status through nodes/status, as the agent does).
What the table says is allowed goes through; everything else is refused (403), and the
Node is left as it was."""

from __future__ import annotations

import copy
import uuid
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from tests.deploy.node_policy_cases import CASES, Case
from tests.e2e.healthd import GPU_NODE_LABEL, Healthd

Obj = dict[str, Any]
# Cluster-side fields a real server adds to a registered Node, never part of a case.
SERVER_ANNOTATIONS = ("node.alpha.kubernetes.io/ttl",)


def _registered(case: Case, name: str, which: str) -> Obj:
    """The case's `old` or `new` Node under this test's name, selected by the agent's
    DaemonSet (its label added on both sides, so it is no part of the change)."""
    node = copy.deepcopy(case.old if which == "old" else case.new)
    meta = node["metadata"]
    meta["name"] = name
    labels = meta.setdefault("labels", {})
    labels[GPU_NODE_LABEL] = "true"
    if "kubernetes.io/hostname" in labels:
        labels["kubernetes.io/hostname"] = name
    for key in ("addresses",):
        for address in node.get("status", {}).get(key, []):
            if address.get("type") == "Hostname":
                address["address"] = name
    return node


def _update(core: k8s.CoreV1Api, current: Obj, new: Obj) -> int:
    """PUT `new` over `current` as the agent: status through nodes/status, the rest
    through the Node; the HTTP status of the first refusal, or 200."""
    new = copy.deepcopy(new)
    new["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
    for key in SERVER_ANNOTATIONS:  # what the server itself wrote stays as it is
        value = (current["metadata"].get("annotations") or {}).get(key)
        if value is not None and "annotations" in new["metadata"]:
            new["metadata"]["annotations"].setdefault(key, value)
    try:
        if new.get("status") != current.get("status"):
            core.replace_node_status(new["metadata"]["name"], new)
        else:
            core.replace_node(new["metadata"]["name"], new)
    except k8s.ApiException as exc:
        return int(exc.status)
    return 200


def test_every_case_of_the_policy_table_on_the_real_api_server(healthd: Healthd,
                                                                tmp_path: Path) -> None:
    suffix = uuid.uuid4().hex[:5]
    names = {case.description: f"policy-{suffix}-{i}" for i, case in enumerate(CASES)}
    healthd.applier.apply(_registered(case, names[case.description], "old") for case in CASES)
    healthd.nodes += list(names.values())  # removed at the end like any test's nodes
    outcomes: dict[str, str] = {}
    for case in CASES:
        name = names[case.description]
        pod = healthd.agent_pod(name)
        agent = k8s.CoreV1Api(healthd.client_for(healthd.token_for(pod, "healthd-agent")))
        before = healthd.node(name)
        code = _update(agent, before, _registered(case, name, "new"))
        outcomes[case.description] = "allowed" if code == 200 else f"refused {code}"
        if code != 200:
            after = healthd.node(name)
            assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    expected = {case.description: "allowed" if case.allowed else "refused 403" for case in CASES}
    assert outcomes == expected
