"""The image run as the agent's DaemonSet Pod runs it (tests/image/pod.py reads every
setting from the rendered manifests): non-root, read-only root, no capabilities, no
privilege escalation, the Pod's limits, command, environment and mounts. It answers
`--version`, judges a simulated machine with `healthd check --sim`, runs under an
arbitrary OpenShift UID, and `healthd agent` on the API emulator gets Ready, publishes
its node's verdict and stops cleanly on SIGTERM within the Pod's grace period."""

from __future__ import annotations

import json
import time
import tomllib
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from healthd.sim.apiserver import ApiEmulator
from tests.deploy.manifests import ROOT
from tests.image import build
from tests.image.pod import AgentPod, agent_pod, free_port

GPU_NODE = "gpu-node-7"
VERDICT = "autopilot.ibm.com/gpuhealth"


@pytest.fixture(scope="module")
def pod() -> AgentPod:
    return agent_pod("device-plugin")


@pytest.fixture
def names() -> Iterator[list[str]]:
    """Containers a test started, removed after it whatever happened."""
    started: list[str] = []
    yield started
    for name in started:
        build.podman("rm", "--force", "--time", "0", name, check=False)


def run_once(image: build.Built, pod: AgentPod, folder: Path, args: list[str],
             **options: Any) -> build.subprocess.CompletedProcess[str]:
    """The Pod's command with `args`, in the foreground."""
    argv = pod.run_args(image.image, name=f"healthd-test-{uuid.uuid4().hex[:8]}",
                        folder=folder, detach=False, args=args, **options)
    return build.podman(*argv, timeout=120, check=False)


def eventually(predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(0.25)
    raise AssertionError(f"no {what} within {timeout_s:.0f} s (last: {last!r})")


def test_it_answers_version_as_the_pod_runs_it(image: build.Built, pod: AgentPod,
                                                tmp_path: Path) -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    proc = run_once(image, pod, tmp_path, ["--version"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"healthd {version}"


@pytest.mark.parametrize(("spec", "status", "code"), [
    ("healthy-8xh100", "PASS", None), ("remap-pending", "ERR", "REMAP_PENDING")])
def test_it_judges_a_simulated_machine(image: build.Built, pod: AgentPod, tmp_path: Path,
                                       spec: str, status: str, code: str | None) -> None:
    proc = run_once(image, pod, tmp_path, ["check", "--sim", spec, "--output", "json"])
    report = json.loads(proc.stdout)
    assert report["status"] == status, proc.stderr
    assert proc.returncode == report["exit_code"]
    if code:
        assert code in proc.stdout


def test_it_runs_under_an_arbitrary_openshift_uid(image: build.Built, tmp_path: Path) -> None:
    """OpenShift's restricted-v2 picks a UID from the namespace's range and GID 0; the
    openshift overlay names none, so any must do."""
    openshift = agent_pod("openshift")
    proc = run_once(image, openshift, tmp_path,
                    ["check", "--sim", "healthy-8xh100", "--output", "json"],
                    user="1000680000:0")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["status"] == "PASS"


def test_the_runtime_has_no_installer(image: build.Built) -> None:
    """Neither pip nor setuptools in the image's virtualenv (the build stage keeps them)."""
    proc = build.podman("run", "--rm", "--network", "none", "--entrypoint", "python",
                        image.image, "-c",
                        "import importlib.util as u; print([m for m in ('pip', 'setuptools',"
                        " 'wheel', 'healthd', 'kubernetes') if u.find_spec(m)])")
    assert proc.stdout.strip() == "['healthd', 'kubernetes']"


def test_the_builds_pip_settings_leave_no_trace(image: build.Built) -> None:
    """This machine's pip settings and CA bundle went in as build secrets: no pip.conf,
    no secrets folder and no pip variable in the image the Pod runs."""
    proc = build.podman("run", "--rm", "--network", "none", "--user", "0", "--entrypoint",
                        "sh", image.image, "-c",
                        "find / -xdev \\( -name 'pip.conf' -o -name 'pip-ca' \\) -print;"
                        " ls -d /run/secrets 2>/dev/null; env | grep '^PIP_' || true")
    assert proc.stdout == ""


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return int(answer.status) == 200
    except OSError:
        return False


def test_the_agent_gets_ready_publishes_its_verdict_and_stops_on_sigterm(
        image: build.Built, pod: AgentPod, tmp_path: Path, names: list[str]) -> None:
    """The DaemonSet's command, args, config and environment, on a simulated healthy
    machine, against the API emulator on the host's loopback (the Pod shares the host's
    network for it; its kubeconfig is the one thing added, as the emulator serves plain
    HTTP instead of in-cluster TLS)."""
    capacity = {"nvidia.com/gpu": "8"}
    with ApiEmulator.in_thread() as api:
        api.seed({"apiVersion": "v1", "kind": "Node", "metadata": {"name": GPU_NODE},
                  "status": {"capacity": capacity, "allocatable": capacity}})
        secrets = tmp_path / "kube"
        secrets.mkdir(mode=0o755)
        api.write_kubeconfig(secrets / "kubeconfig").chmod(0o644)
        port = free_port()
        name = f"healthd-agent-{uuid.uuid4().hex[:8]}"
        names.append(name)
        build.podman(*pod.run_args(
            image.image, name=name, folder=tmp_path, node=GPU_NODE, host_network=True,
            extra_args=["--sim", "healthy-8xh100", "--http-port", str(port)],
            extra_env={"KUBECONFIG": "/var/run/healthd-test/kubeconfig"},
            mounts=[(secrets, "/var/run/healthd-test")]))

        def logs() -> str:
            return build.podman("logs", name, check=False).stderr[-3000:]

        path, _ = pod.probe_path("readinessProbe")
        started = time.monotonic()
        try:
            eventually(lambda: _ready(f"http://127.0.0.1:{port}{path}"), 60, "readiness")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{logs()}") from None
        ready_s = time.monotonic() - started

        def node() -> dict[str, Any]:
            found: dict[str, Any] = api.get("Node", GPU_NODE)
            return found

        eventually(lambda: (node()["metadata"].get("labels") or {}).get(VERDICT) == "PASS",
                   30, f"{VERDICT}=PASS on {GPU_NODE}")
        # The condition goes through nodes/status, a write of its own after the label.
        eventually(lambda: {c["type"]: c["status"] for c in node()["status"].get(
            "conditions", [])}.get("GPUUnhealthy") == "False", 30, "GPUUnhealthy=False")

        started = time.monotonic()
        build.podman("stop", "--time", str(pod.grace_s), name, timeout=pod.grace_s + 30)
        stopped_s = time.monotonic() - started
        state = json.loads(build.podman("inspect", "--format", "{{json .State}}", name).stdout)
        assert state["ExitCode"] == 0, logs()  # its own clean exit, not the grace's SIGKILL
        assert stopped_s < pod.grace_s
        assert "Traceback" not in logs()
        print(f"ready in {ready_s:.1f} s, stopped in {stopped_s:.2f} s")
