"""The agent's DaemonSet Pod as a `podman run`, every setting read from the rendered
manifests (`kubectl kustomize`), as the kubelet would apply it: the user and group, the
read-only root, the dropped capabilities, no privilege escalation, the sysctls, the
limits, the command and args, the environment (fieldRefs resolved, `$(VAR)` expanded),
the ConfigMap and emptyDir mounts, and the grace period a stop gets.

What a test adds is explicit in its call: extra args (`--sim`, a port), extra env, extra
mounts (the service account's token, where the kubelet mounts it). A setting the
manifests gain that this translation does not know fails the test, by name, instead of
being silently dropped.
"""

from __future__ import annotations

import dataclasses
import json
import re
import socket
from pathlib import Path
from typing import Any

from tests.deploy.manifests import OVERLAYS, one, render

NAMESPACE = "healthd-system"
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
Obj = dict[str, Any]
_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
# What this translation knows of a container and a pod spec; anything else set there
# fails `check_known` (a new setting must be translated, or named here as not applying).
_CONTAINER_KEYS = {"name", "image", "command", "args", "ports", "env", "resources",
                   "livenessProbe", "readinessProbe", "securityContext", "volumeMounts"}
# nodeSelector, tolerations, priorityClassName: scheduling, done by the scheduler.
_POD_KEYS = {"serviceAccountName", "priorityClassName", "nodeSelector", "tolerations",
             "terminationGracePeriodSeconds", "securityContext", "containers", "volumes"}


@dataclasses.dataclass(frozen=True)
class AgentPod:
    """The agent's container and Pod spec, from the rendered DaemonSet."""

    objects: list[Obj]
    spec: Obj
    container: Obj

    @property
    def grace_s(self) -> int:
        return int(self.spec.get("terminationGracePeriodSeconds", 30))

    @property
    def user(self) -> tuple[int, int]:
        context = self.spec.get("securityContext") or {}
        return int(context["runAsUser"]), int(context["runAsGroup"])

    def port(self, name: str) -> int:
        (port,) = [p["containerPort"] for p in self.container["ports"] if p["name"] == name]
        return int(port)

    def probe_path(self, probe: str) -> tuple[str, int]:
        """(path, port number) of the container's `probe` (readinessProbe, ...)."""
        get = self.container[probe]["httpGet"]
        port = get["port"]
        return get["path"], self.port(port) if isinstance(port, str) else int(port)

    def config_text(self) -> dict[str, str]:
        """The files of the config volume: the ConfigMap's data."""
        (volume,) = [v for v in self.spec["volumes"] if v["name"] == "config"]
        configmap = one(self.objects, "ConfigMap", volume["configMap"]["name"])
        return dict(configmap["data"])

    def check_known(self) -> None:
        unknown = sorted(set(self.container) - _CONTAINER_KEYS) + sorted(
            set(self.spec) - _POD_KEYS)
        assert not unknown, f"tests/image/pod.py does not translate {unknown}"

    # -- podman run ---------------------------------------------------------------------

    def run_args(self, image: str, *, name: str, folder: Path, node: str = "gpu-node-1",
                 pod_name: str = "healthd-agent-test", host_network: bool = False,
                 detach: bool = True, args: list[str] | None = None, user: str | None = None,
                 config: dict[str, str] | None = None, extra_args: list[str] | None = None,
                 extra_env: dict[str, str] | None = None,
                 mounts: list[tuple[Path, str]] | None = None,
                 writable_mounts: list[tuple[Path, str]] | None = None) -> list[str]:
        """`podman run` arguments for the agent of `node` as Pod `pod_name`; `folder`
        holds its volumes. `args` replaces the container's args (the command stays);
        `extra_args` follow them; `user` (UID:GID) is the one a platform picks where the
        manifests name none (OpenShift's SCCs). `host_network`: the Pod shares the host's loopback
        (to reach an API server there); the Pod's net.* sysctls cannot apply then and
        are left out, as the kubelet refuses them; without it the Pod has a network
        namespace of its own with no link but loopback."""
        self.check_known()
        run = ["run", "--name", name, *(["--detach"] if detach else ["--rm"])]
        run += self._security(host_network, user)
        run += self._limits()
        run += ["--network", "host" if host_network else "none"]
        env = self.env(node=node, pod_name=pod_name, host_ip="127.0.0.1")
        env.update(extra_env or {})
        for key, value in env.items():
            run += ["--env", f"{key}={value}"]
        run += self._volumes(folder, config)
        for source, target in mounts or []:
            run += ["--volume", f"{source}:{target}:ro"]
        for source, target in writable_mounts or []:
            run += ["--volume", f"{source}:{target}"]
        command = self.container.get("command")
        if command:
            run += ["--entrypoint", json.dumps([self.expand(c, env) for c in command])]
        given = self.container.get("args", []) if args is None else args
        return [*run, image, *[self.expand(a, env) for a in given], *(extra_args or [])]

    def _security(self, host_network: bool, user: str | None) -> list[str]:
        pod = self.spec.get("securityContext") or {}
        container = self.container.get("securityContext") or {}
        if user is None:
            uid, gid = self.user
            user = f"{uid}:{gid}"
        if pod.get("runAsNonRoot"):
            assert not user.startswith("0:"), "runAsNonRoot as UID 0: the kubelet refuses it"
        args = ["--user", user]
        if container.get("readOnlyRootFilesystem"):
            # Only the root: no tmpfs of podman's own where Kubernetes mounts none.
            args += ["--read-only", "--read-only-tmpfs=false"]
        if container.get("allowPrivilegeEscalation") is False:
            args += ["--security-opt", "no-new-privileges"]
        if container.get("privileged"):
            args.append("--privileged")
        capabilities = container.get("capabilities") or {}
        args += [f"--cap-drop={c}" for c in capabilities.get("drop", [])]
        args += [f"--cap-add={c}" for c in capabilities.get("add", [])]
        seccomp = (container.get("seccompProfile") or pod.get("seccompProfile") or {}).get(
            "type", "RuntimeDefault")
        assert seccomp in ("RuntimeDefault", "Unconfined"), seccomp
        if seccomp == "Unconfined":
            args += ["--security-opt", "seccomp=unconfined"]
        for sysctl in pod.get("sysctls", []):
            if not (host_network and sysctl["name"].startswith("net.")):
                args += ["--sysctl", f"{sysctl['name']}={sysctl['value']}"]
        return args

    def _limits(self) -> list[str]:
        limits = (self.container.get("resources") or {}).get("limits") or {}
        args = []
        if "memory" in limits:
            args += ["--memory", _bytes(limits["memory"])]
        if "cpu" in limits:
            args += ["--cpus", _cpus(limits["cpu"])]
        return args

    def env(self, *, node: str, pod_name: str, host_ip: str) -> dict[str, str]:
        """The container's environment as the kubelet sets it."""
        fields = {"spec.nodeName": node, "metadata.name": pod_name,
                  "metadata.namespace": NAMESPACE, "status.hostIP": host_ip,
                  "status.podIP": host_ip, "spec.serviceAccountName":
                  self.spec.get("serviceAccountName", "default")}
        out: dict[str, str] = {}
        for entry in self.container.get("env", []):
            if "value" in entry:
                out[entry["name"]] = self.expand(entry["value"], out)
                continue
            ref = entry["valueFrom"].get("fieldRef")
            assert ref, f"tests/image/pod.py does not translate env {entry}"
            out[entry["name"]] = fields[ref["fieldPath"]]
        return out

    @staticmethod
    def expand(text: str, env: dict[str, str]) -> str:
        """Kubernetes' `$(VAR)`: a defined variable's value, else left as written."""
        return _REF.sub(lambda m: env.get(m.group(1), m.group(0)), text)

    def _volumes(self, folder: Path, config: dict[str, str] | None) -> list[str]:
        volumes = {v["name"]: v for v in self.spec.get("volumes", [])}
        args: list[str] = []
        for mount in self.container.get("volumeMounts", []):
            volume = volumes[mount["name"]]
            suffix = ":ro" if mount.get("readOnly") else ""
            if "hostPath" in volume:  # the host's own file, as the kubelet binds it
                args += ["--volume", f"{volume['hostPath']['path']}:{mount['mountPath']}{suffix}"]
                continue
            source = folder / "volumes" / mount["name"]
            source.mkdir(parents=True, exist_ok=True)
            if "configMap" in volume:
                files = config if config is not None else self.config_text()
                for key, text in files.items():
                    (source / key).write_text(text)
                    (source / key).chmod(0o644)  # the configMap volume's defaultMode
                source.chmod(0o755)
            elif "emptyDir" in volume:
                source.chmod(0o777)  # as the kubelet makes an emptyDir: any UID writes
            else:
                raise AssertionError(f"tests/image/pod.py does not translate volume {volume}")
            args += ["--volume", f"{source}:{mount['mountPath']}{suffix}"]
        return args


def agent_pod(overlay: str = "device-plugin") -> AgentPod:
    """The agent's Pod as the overlay renders it (the e2e tests install device-plugin)."""
    return agent_pod_of(render(OVERLAYS[overlay]))


def agent_pod_of(objects: list[Obj]) -> AgentPod:
    """The agent's Pod in `objects`, rendered manifests (what a test installed)."""
    daemonset = one(objects, "DaemonSet", "healthd-agent")
    spec = daemonset["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    return AgentPod(objects, spec, container)


def service_account_files(folder: Path, token: str, ca: bytes) -> Path:
    """What the kubelet projects at SERVICE_ACCOUNT_DIR: the Pod-bound token, the
    cluster's CA and the namespace, readable by the Pod's user."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "token").write_text(token)
    (folder / "ca.crt").write_bytes(ca)
    (folder / "namespace").write_text(NAMESPACE)
    for path in [folder, *folder.iterdir()]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return folder


def free_port() -> int:
    """A free TCP port on loopback (the agent's HTTP port when it shares the host's)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "K": 10**3, "M": 10**6, "G": 10**9}


def _bytes(quantity: str) -> str:
    for suffix, factor in _UNITS.items():
        if quantity.endswith(suffix):
            return str(int(float(quantity[: -len(suffix)]) * factor))
    return str(int(quantity))


def _cpus(quantity: str) -> str:
    return str(int(quantity[:-1]) / 1000) if quantity.endswith("m") else str(float(quantity))
