"""`kubectl get events -o wide` and `kubectl describe node` read the same on the emulator
(what the demo serves) as on a real API server.

The same demo Node goes to both, then healthd's own writers publish on it: the agent's
`NodePublisher` (verdict label, annotations, the GPUUnhealthy condition and the
transition Event) and the controller's `EventRecorder`. kubectl's output is compared
after what must differ is made equal: ages and times, the generated Event-name suffix,
and what a real cluster's own controllers add (the node TTL annotation, node-controller
Events).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import uuid
from pathlib import Path

import anyio
import pytest

from healthd.agent.node_status import NodePublisher, desired_from
from healthd.demo.cluster import node_object
from healthd.kube.backoff import Backoff
from healthd.kube.client import Kube
from healthd.kube.conventions import COMPONENT, CONTROLLER_COMPONENT, Keys, Reason
from healthd.kube.events import WARNING, EventRecorder
from healthd.kube.objects import EVENTS, NODES
from healthd.sim.apiserver import ApiEmulator
from tests.agent_publish.conftest import finding, judged, result

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

KEYS = Keys()
# Written by a real cluster's controllers, not by its API server: not the emulator's job.
CLUSTER_OWN = (re.compile(r"^\s*node\.alpha\.kubernetes\.io/ttl: 0$"),
               re.compile(r"\bnode-controller\b"))
_NOT_READY_TAINT = re.compile(r"^(\s*Taints:\s*)node\.kubernetes\.io/not-ready:NoSchedule$")
_AGE = re.compile(r"(?<![\w.-])(\d+[smhdy])+(?![\w.-])|<unknown>")
_HTTP_TIME = re.compile(r"\w{3}, \d\d \w{3} \d{4} \d\d:\d\d:\d\d [+-]\d{4}")
_ISO_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z")


@pytest.fixture
def kubectl() -> str:
    found = shutil.which("kubectl")
    if found is None:
        pytest.skip("kubectl is not installed (Debian package kubernetes-client)")
    return found


async def _publish(kubeconfig: Path, node: str) -> None:
    """The demo's node, then healthd's writes on it: PASS, XID 79 -> EVICT, and a
    controller Event about the node."""
    async with await Kube.connect(str(kubeconfig)) as kube:
        await kube.create(NODES, node_object(node, 8, "NVIDIA H100 80GB HBM3"))
        publisher = NodePublisher(kube, node, KEYS,
                                  EventRecorder(kube, component=COMPONENT, host=node),
                                  backoff=Backoff(initial=0.05, maximum=0.2))
        xid = finding("XID_79", 3, "XID 79: GPU has fallen off the bus")
        async with anyio.create_task_group() as tg:
            tg.start_soon(publisher.run)
            for state in (judged(("xid", result("xid"))), judged(("xid", result("xid", xid)))):
                publisher.want(desired_from(state, KEYS, node=node, dcgm_levels={}), state)
                assert await publisher.flush(10), publisher.last_error
            tg.cancel_scope.cancel()
        controller = EventRecorder(kube, component=CONTROLLER_COMPONENT,
                                   host="healthd-controller-0")
        await controller.record(await kube.get(NODES, node), type=WARNING,
                                reason=Reason.PEER_UNREACHABLE.value, res=NODES,
                                message=f"{node} does not answer its peers on network default")


async def _remove(kubeconfig: Path, node: str) -> None:
    async with await Kube.connect(str(kubeconfig)) as kube:
        listing = await kube.list(EVENTS, "default", field_selector=f"involvedObject.name={node}")
        for event in listing["items"]:
            await kube.delete(EVENTS, event["metadata"]["name"], "default")
        await kube.delete(NODES, node)


def _views(kubectl: str, kubeconfig: Path, node: str) -> dict[str, str]:
    def run(*args: str) -> str:
        done = subprocess.run([kubectl, f"--kubeconfig={kubeconfig}", *args],
                              capture_output=True, text=True, timeout=30, check=False)
        assert done.returncode == 0, done.stderr
        return done.stdout

    return {"get events": run("get", "events", "-n", "default", "-o", "wide",
                              "--field-selector", f"involvedObject.name={node}"),
            "describe node": run("describe", "node", node)}


def normalized(text: str, node: str) -> list[str]:
    """Lines with times, ages and generated suffixes made equal, column padding
    collapsed (it follows the widths of those), the cluster's own additions dropped."""
    out = []
    for line in text.splitlines():
        if any(own.search(line) for own in CLUSTER_OWN):
            continue
        # A new Node carries the not-ready taint until the node controller has seen it
        # Ready (admission adds it): the cluster's, and gone a moment later.
        line = _NOT_READY_TAINT.sub(r"\1<none>", line)
        line = re.sub(rf"{re.escape(node)}\.[a-z0-9]{{5}}\b", f"{node}.XXXXX", line)
        line = _ISO_TIME.sub("TIME", _HTTP_TIME.sub("TIME", line))
        line = _AGE.sub("AGE", line)
        out.append(" ".join(line.split()))
    return _events_in_any_order(out)


def _events_in_any_order(lines: list[str]) -> list[str]:
    """Event rows sorted: both servers list by name, whose suffix is random, and
    `describe` orders by time, equal here to the second."""
    if lines and lines[0].startswith("LAST SEEN"):
        return [lines[0], *sorted(lines[1:])]
    if "Events:" in lines:
        start = lines.index("Events:") + 3  # the title, the column names, the rule
        return [*lines[:start], *sorted(lines[start:])]
    return lines


async def test_kubectl_shows_the_demo_node_and_its_events_as_a_real_cluster(
        kubectl: str, e2e_kubeconfig: Path, tmp_path: Path) -> None:
    node = f"gpu-node-{uuid.uuid4().hex[:6]}"
    views: dict[str, dict[str, list[str]]] = {}
    async with ApiEmulator() as api:
        targets = {"emulator": api.write_kubeconfig(tmp_path / "emulator.kubeconfig"),
                   "cluster": e2e_kubeconfig}
        for name, kubeconfig in targets.items():
            try:
                await _publish(kubeconfig, node)
                raw = await anyio.to_thread.run_sync(_views, kubectl, kubeconfig, node)
            finally:
                await _remove(kubeconfig, node)
            views[name] = {what: normalized(text, node) for what, text in raw.items()}
    for what in ("get events", "describe node"):
        assert views["emulator"][what] == views["cluster"][what], what
    events = views["cluster"]["get events"]
    assert len(events) == 3 and "XID_79" in events[1] + events[2]  # both Events, seen
