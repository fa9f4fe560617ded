"""RBAC and the admission policies, enforced by the real API server: with the token the
kubelet would mount into its Pod, an agent writes healthd's keys on its own Node and
is refused (the real 403) on another Node, on keys that are not healthd's, on the
Node's spec, on watching the agent pods (its ping peers come from its own Node), and
on anything RBAC does not grant; the controller writes ping's peers on a Node and
nothing else of it."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client as k8s

from tests.e2e.healthd import NAMESPACE, Healthd

VERDICT = "autopilot.ibm.com/gpuhealth"


def _status(call: Callable[[], Any]) -> int:
    try:
        call()
    except k8s.ApiException as exc:
        return int(exc.status)
    return 200


@pytest.fixture
def two_nodes(healthd: Healthd) -> tuple[str, str]:
    suffix = uuid.uuid4().hex[:5]
    nodes = (f"rights-{suffix}-a", f"rights-{suffix}-b")
    healthd.add_nodes(*nodes)
    return nodes


def _labels(**labels: str | None) -> dict[str, Any]:
    return {"metadata": {"labels": labels}}


def test_the_agent_writes_only_healthds_keys_on_its_own_node(
        healthd: Healthd, two_nodes: tuple[str, str]) -> None:
    own, other = two_nodes
    pod = healthd.running_pod("app.kubernetes.io/name=healthd-agent", own)
    agent = k8s.CoreV1Api(healthd.client_for(healthd.token_for(pod, "healthd-agent")))
    allowed = {
        "its verdict label": lambda: agent.patch_node(own, _labels(**{VERDICT: "WARN"})),
        "a dcgm level label": lambda: agent.patch_node(
            own, _labels(**{"autopilot.ibm.com/dcgm.level.3": "PASS_2026-11-25_01.00.00UTC"})),
        "its health annotation": lambda: agent.patch_node(
            own, {"metadata": {"annotations": {"healthd.io/health": "{}"}}}),
        "its condition": lambda: agent.patch_node_status(own, {"status": {"conditions": [
            {"type": "GPUUnhealthy", "status": "False", "reason": "AllChecksPassed"}]}}),
    }
    for what, call in allowed.items():
        assert _status(call) == 200, what
    assert healthd.label(own) == "WARN"

    healthd.wait_for_node_policy(agent, other)
    refused = {
        "another node's verdict": lambda: agent.patch_node(other, _labels(**{VERDICT: "EVICT"})),
        "a label that is not healthd's": lambda: agent.patch_node(
            own, _labels(**{"node-role.kubernetes.io/gpu": "x"})),
        "an annotation that is not healthd's": lambda: agent.patch_node(
            own, {"metadata": {"annotations": {"example.com/x": "y"}}}),
        "a cordon": lambda: agent.patch_node(own, {"spec": {"unschedulable": True}}),
        "a taint": lambda: agent.patch_node(own, {"spec": {"taints": [
            {"key": "x", "value": "y", "effect": "NoSchedule"}]}}),
        "its node's capacity": lambda: agent.patch_node_status(
            own, {"status": {"capacity": {"nvidia.com/gpu": "4"}}}),
        "another condition": lambda: agent.patch_node_status(own, {"status": {"conditions": [
            {"type": "Ready", "status": "False", "reason": "Mine"}]}}),
        "deleting its node": lambda: agent.delete_node(own),
        "reading secrets": lambda: agent.list_namespaced_secret(NAMESPACE),
        "changing a pod": lambda: agent.patch_namespaced_pod(
            pod["metadata"]["name"], NAMESPACE, _labels(x="y")),
        "watching the agent pods": lambda: agent.list_namespaced_pod(
            NAMESPACE, watch=True, timeout_seconds=1, _preload_content=False),
        "watching every pod": lambda: agent.list_pod_for_all_namespaces(
            watch=True, timeout_seconds=1, _preload_content=False),
    }
    statuses = {what: _status(call) for what, call in refused.items()}
    assert statuses == dict.fromkeys(refused, 403)
    assert healthd.label(other) is None
    assert "node-role.kubernetes.io/gpu" not in (healthd.node(own)["metadata"]["labels"])


def test_a_token_not_bound_to_a_node_writes_no_node(
        healthd: Healthd, two_nodes: tuple[str, str]) -> None:
    own, _ = two_nodes
    request = k8s.AuthenticationV1TokenRequest(
        spec=k8s.V1TokenRequestSpec(audiences=[], expiration_seconds=600))
    token = healthd.core.create_namespaced_service_account_token(
        "healthd-agent", NAMESPACE, request).status.token
    agent = k8s.CoreV1Api(healthd.client_for(token))
    assert _status(lambda: agent.patch_node(own, _labels(**{VERDICT: "EVICT"}))) == 403
    assert healthd.label(own) is None


def test_the_controller_resets_lends_and_writes_only_peers_and_repair_on_a_node(
        healthd: Healthd, two_nodes: tuple[str, str]) -> None:
    own, _ = two_nodes
    pod = healthd.running_pod("app.kubernetes.io/name=healthd-controller")
    client = healthd.client_for(healthd.token_for(pod, "healthd-controller"))
    core = k8s.CoreV1Api(client)
    assert _status(lambda: core.list_node()) == 200
    assert _status(lambda: core.list_pod_for_all_namespaces(limit=1)) == 200
    peers = '{"epoch":1,"peers":[]}'
    assert _status(lambda: core.patch_node(
        own, {"metadata": {"annotations": {"healthd.io/peers": peers}}})) == 200
    assert healthd.node(own)["metadata"]["annotations"]["healthd.io/peers"] == peers
    healthd.wait_for_node_policy(core, own)
    assert _status(lambda: core.patch_node(own, {"metadata": {"annotations": {
        "healthd.io/repair": None}}})) == 200
    refused = {
        "a verdict label": lambda: core.patch_node(own, _labels(**{VERDICT: "PASS"})),
        "the agent's health annotation": lambda: core.patch_node(
            own, {"metadata": {"annotations": {"healthd.io/health": "{}"}}}),
        "a cordon": lambda: core.patch_node(own, {"spec": {"unschedulable": True}}),
        "a node's status": lambda: core.patch_node_status(own, {"status": {"conditions": [
            {"type": "Ready", "status": "False", "reason": "Mine"}]}}),
        "deleting a pod": lambda: core.delete_namespaced_pod(pod["metadata"]["name"],
                                                             NAMESPACE),
    }
    statuses = {what: _status(call) for what, call in refused.items()}
    assert statuses == dict.fromkeys(refused, 403)
    custom = k8s.CustomObjectsApi(client)
    assert _status(lambda: custom.list_cluster_custom_object(
        "workload.codeflare.dev", "v1beta2", "appwrappers")) == 200
    assert _status(lambda: custom.list_cluster_custom_object(
        "kueue.x-k8s.io", "v1beta2", "clusterqueues")) == 200
    assert _status(lambda: custom.delete_cluster_custom_object(
        "kueue.x-k8s.io", "v1beta2", "clusterqueues", "anything")) == 403
