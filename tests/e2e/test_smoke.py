"""healthd installed from its manifests on the real control plane: the DaemonSet puts
an agent Pod on each GPU node (and only there), the agent running with that Pod's
token publishes its node's verdict, and the controller takes its Lease."""

from __future__ import annotations

import uuid

from tests.e2e.healthd import NAMESPACE, Healthd, eventually, system_node


def test_agents_publish_verdicts_with_their_pods_identity(healthd: Healthd) -> None:
    suffix = uuid.uuid4().hex[:5]
    gpu_nodes = [f"gpu-{suffix}-{i}" for i in (1, 2)]
    healthd.add_nodes(*gpu_nodes)
    healthd.applier.apply([system_node(f"cpu-{suffix}")])  # no GPUs, not selected
    healthd.nodes.append(f"cpu-{suffix}")
    agents = {node: healthd.start_agent(node) for node in gpu_nodes}
    for node in gpu_nodes:
        eventually(lambda n=node: healthd.label(n) == "PASS", 60,
                   f"PASS on {node}")  # type: ignore[misc]
    pods = healthd.core.list_namespaced_pod(
        NAMESPACE, label_selector="app.kubernetes.io/name=healthd-agent").items
    assert f"cpu-{suffix}" not in {p.spec.node_name for p in pods}
    agents[gpu_nodes[0]].fault(op="emit_xid", gpu=3, code=79)
    eventually(lambda: healthd.label(gpu_nodes[0]) == "EVICT", 30, "EVICT after XID 79")
    assert healthd.label(gpu_nodes[1]) == "PASS"
