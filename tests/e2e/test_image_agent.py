"""One agent of the e2e cluster run from healthd's image (tests/image), as the kubelet
would run its DaemonSet Pod: on the real control plane, as the agent of one kwok node,
its settings read from the installed manifests, with the Pod-bound token, the cluster's
CA and the namespace mounted where the kubelet mounts them and the in-cluster
KUBERNETES_SERVICE_HOST/PORT. It publishes its node's verdict, raises it on a fault,
is held by the admission policy like the process agents, and stops cleanly on SIGTERM.
(The Pod shares the host's network, to reach the API server on loopback.)"""

from __future__ import annotations

import base64
import json
import urllib.parse
import uuid
from pathlib import Path

import pytest
import yaml
from kubernetes import client as k8s

from tests.e2e.healthd import Healthd, eventually
from tests.image import build
from tests.image.pod import (
    SERVICE_ACCOUNT_DIR,
    agent_pod_of,
    free_port,
    service_account_files,
)

SIM_DIR = "/var/run/healthd-sim"  # the simulated machine's state: the node's "hardware"


@pytest.mark.image
@pytest.mark.timeout(1500)  # a cold machine builds the image first
def test_an_agent_from_the_image_publishes_its_verdict_held_by_the_policy(
        image: build.Built, healthd: Healthd, tmp_path: Path) -> None:
    suffix = uuid.uuid4().hex[:5]
    node, other = f"image-{suffix}-1", f"image-{suffix}-2"
    healthd.add_nodes(node, other)
    pod = healthd.running_pod("app.kubernetes.io/name=healthd-agent", node)
    token = healthd.token_for(pod, "healthd-agent")
    cluster = yaml.safe_load(healthd.kubeconfig.read_text())["clusters"][0]["cluster"]
    server = urllib.parse.urlsplit(cluster["server"])
    account = service_account_files(tmp_path / "serviceaccount", token,
                                    base64.b64decode(cluster["certificate-authority-data"]))
    machine = tmp_path / "machine"
    machine.mkdir(mode=0o777)
    machine.chmod(0o777)  # the Pod's user writes the machine's state there
    (machine / "control.jsonl").touch(mode=0o666)
    port = free_port()
    spec = agent_pod_of(healthd.objects)
    name = f"healthd-agent-{suffix}"
    argv = spec.run_args(
        image.image, name=name, folder=tmp_path, node=node, pod_name=pod["metadata"]["name"],
        host_network=True,
        config={"config.yaml": healthd.config_file().read_text()},
        extra_args=["--sim", "healthy-8xh100", "--sim-control", f"{SIM_DIR}/control.jsonl",
                    "--http-port", str(port)],
        extra_env={"KUBERNETES_SERVICE_HOST": str(server.hostname),
                   "KUBERNETES_SERVICE_PORT": str(server.port)},
        mounts=[(account, SERVICE_ACCOUNT_DIR)], writable_mounts=[(machine, SIM_DIR)])
    build.podman(*argv)

    def logs() -> str:
        return build.podman("logs", name, check=False).stderr[-4000:]

    try:
        try:
            eventually(lambda: healthd.label(node) == "PASS", 90, f"PASS on {node}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{logs()}") from None
        # The condition goes through nodes/status, a write of its own after the label.
        eventually(lambda: {c["type"]: c["status"] for c in healthd.node(node)["status"].get(
            "conditions", [])}.get("GPUUnhealthy") == "False", 30, "GPUUnhealthy=False")

        with open(machine / "control.jsonl", "a") as control:
            control.write(json.dumps({"op": "emit_xid", "gpu": 3, "code": 79}) + "\n")
        eventually(lambda: healthd.label(node) == "EVICT", 30, "EVICT after XID 79")
        assert healthd.label(other) is None  # no agent there, and this one cannot write it

        # The token the container runs with is held to its own node and healthd's keys.
        agent = k8s.CoreV1Api(healthd.client_for(token))
        healthd.wait_for_node_policy(agent, other)
        with pytest.raises(k8s.ApiException) as refused:
            agent.patch_node(node, {"metadata": {"labels": {"team": "mine"}}}, dry_run="All")
        assert refused.value.status == 403

        build.podman("stop", "--time", str(spec.grace_s), name, timeout=spec.grace_s + 30)
        state = json.loads(build.podman("inspect", "--format", "{{json .State}}", name).stdout)
        assert state["ExitCode"] == 0, logs()
        assert "Traceback" not in logs()
    finally:
        build.podman("rm", "--force", "--time", "0", name, check=False)
