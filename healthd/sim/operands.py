"""A stand-in for the NVIDIA GPU Operator's operands on the API emulator.

The emulator runs no DaemonSet controller. `FakeOperands` plays the part the operator's
DaemonSets play on a GPU node, for the operands that hold its GPUs (the device plugin,
DCGM, dcgm-exporter, GPU Feature Discovery): each is a DaemonSet whose nodeSelector is
one node label (`nvidia.com/gpu.deploy.dcgm: "true"`, ...), so

- a node whose label says "true" runs the operand's pod (named `<operand>-<node>`,
  bound to the node, Running, its nodeSelector copied from the DaemonSet's template as
  the real controller copies it);
- a node whose label says anything else (the GPU Operator's documented way to remove an
  operand from one node is "false"), or lacks it, loses the pod: it is marked for
  deletion first and goes after `grace_s`, as a pod's termination grace period runs;
- while the pod exists, it holds the node's GPUs: `hold(node, pod, True)` when it
  starts, `hold(node, pod, False)` once it is gone (the simulated machine's named
  holders, healthd.sim.holders, so that a GPU reset there is refused while it runs).

Its own writes stay out of the emulator's request log, like the fake kubelet's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import anyio
import anyio.abc

from healthd.sim.apiserver.emulator import ApiEmulator
from healthd.sim.apiserver.store import now_text
from healthd.sim.kubelet import follow

# The operands that hold GPUs, by the name of their DaemonSet and its node label.
OPERANDS: Mapping[str, str] = {
    "nvidia-device-plugin-daemonset": "nvidia.com/gpu.deploy.device-plugin",
    "nvidia-dcgm": "nvidia.com/gpu.deploy.dcgm",
    "nvidia-dcgm-exporter": "nvidia.com/gpu.deploy.dcgm-exporter",
    "gpu-feature-discovery": "nvidia.com/gpu.deploy.gpu-feature-discovery",
}
NAMESPACE = "gpu-operator"
DEPLOYED = "true"

Hold = Callable[[str, str, bool], None]  # (node, "namespace/pod", holds)


def operand_labels(value: str = DEPLOYED) -> dict[str, str]:
    """The labels the operator puts on a GPU node it manages."""
    return {label: value for label in OPERANDS.values()}


class FakeOperands:
    """The operands' DaemonSets on every node of the emulator (see the module doc)."""

    def __init__(self, api: ApiEmulator, *, hold: Hold | None = None,
                 operands: Mapping[str, str] = OPERANDS, grace_s: float = 0.5) -> None:
        self.api = api
        self.operands = dict(operands)
        self.grace_s = grace_s
        self._hold = hold or (lambda node, pod, holds: None)
        self._leaving: set[str] = set()  # pods marked for deletion, going after grace_s

    async def run(self) -> None:
        """Keep the operands' pods in step with the nodes' labels until cancelled."""
        async with anyio.create_task_group() as group:
            await follow(self.api, "v1", "Node", lambda _kind, _node: self._sync(group))

    def pods(self, node: str) -> list[str]:
        """The operand pods on `node` now (marked for deletion included)."""
        return sorted(p["metadata"]["name"] for p in self.api.list("Pod", NAMESPACE)
                      if p["spec"].get("nodeName") == node)

    def _sync(self, group: anyio.abc.TaskGroup) -> None:
        for node in self.api.list("Node"):
            name = node["metadata"]["name"]
            labels = node["metadata"].get("labels") or {}
            for operand, label in self.operands.items():
                pod = f"{operand}-{name}"
                present = self.api.get("Pod", pod, NAMESPACE)
                wanted = labels.get(label) == DEPLOYED
                if wanted and present is None:
                    self._start(pod, name, operand, label)
                elif not wanted and present is not None and pod not in self._leaving:
                    self._leaving.add(pod)
                    present["metadata"]["deletionTimestamp"] = now_text()
                    self.api.put(present)
                    group.start_soon(self._remove, group, pod, name)

    def _start(self, pod: str, node: str, operand: str, label: str) -> None:
        self.api.put({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod, "namespace": NAMESPACE, "labels": {"app": operand},
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                                              "name": operand, "uid": f"ds-{operand}",
                                              "controller": True}]},
            "spec": {"nodeName": node, "nodeSelector": {label: DEPLOYED},
                     "containers": [{"name": operand, "image": operand}]},
            "status": {"phase": "Running"}})
        self._hold(node, f"{NAMESPACE}/{pod}", True)

    async def _remove(self, group: anyio.abc.TaskGroup, pod: str, node: str) -> None:
        await anyio.sleep(self.grace_s)
        self._hold(node, f"{NAMESPACE}/{pod}", False)  # its container ended
        self.api.remove("Pod", pod, NAMESPACE)
        self._leaving.discard(pod)
        self._sync(group)  # the label may have come back meanwhile
