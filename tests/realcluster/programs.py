"""The pinned upstream programs of the real control plane, built from their Go modules.

Each program lives in a small Go module of its own under `modules/` (its `go.mod` and
`go.sum` pin the version and every checksum; `tool` lines name the main packages), so
their dependencies never mix. Binaries go to a cache outside the clone, in a folder
keyed by everything that decides the build: rebuilding is a no-op when nothing changed,
and a changed pin never reuses an old binary.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tests.cachelock import cache_locked

MODULES = Path(__file__).parent / "modules"
KUBERNETES_VERSION = "v1.35.4"
_VERSION_PKG = "k8s.io/component-base/version"
_KUBE_LDFLAGS = (
    f"-X {_VERSION_PKG}.gitVersion={KUBERNETES_VERSION} -X {_VERSION_PKG}.gitMajor=1"
    f" -X {_VERSION_PKG}.gitMinor=35 -X {_VERSION_PKG}.gitTreeState=clean"
)
def pinned_version(module_folder: str, module: str) -> str:
    """The version of `module` that `modules/<module_folder>/go.mod` pins."""
    for line in (MODULES / module_folder / "go.mod").read_text().splitlines():
        words = line.split()
        if words and words[0] in (module, "require") and module in words:
            return words[words.index(module) + 1]
    raise BuildError(f"{module} is not pinned in modules/{module_folder}/go.mod")


def _helm_ldflags() -> str:
    """What Helm's own Makefile stamps: its version, and the Kubernetes version of the
    client-go it is built with (helm template and lint assume it without a cluster)."""
    version = pinned_version("helm", "helm.sh/helm/v3")
    minor = pinned_version("helm", "k8s.io/client-go").split(".")[1]
    stamps = [f"internal/version.version={version}", "internal/version.gitTreeState=clean"]
    stamps += [f"pkg/{pkg}.k8sVersion{part}={value}" for pkg in ("lint/rules", "chartutil")
               for part, value in (("Major", "1"), ("Minor", minor))]
    return " ".join(f"-X helm.sh/helm/v3/{stamp}" for stamp in stamps)


# The AppWrapper operator's releases are served by the module proxy but are absent from
# the public checksum database: go.sum (committed) is what pins them.
_NOSUMDB = "github.com/project-codeflare"


@dataclasses.dataclass(frozen=True)
class Program:
    name: str  # the binary's name in the cache
    module: str  # folder under modules/
    package: str  # main package ("." for our own main)
    ldflags: str = ""


PROGRAMS = {
    p.name: p
    for p in (
        Program("etcd", "etcd", "."),
        Program("kube-apiserver", "kubernetes", "k8s.io/kubernetes/cmd/kube-apiserver",
                _KUBE_LDFLAGS),
        Program("kube-controller-manager", "kubernetes",
                "k8s.io/kubernetes/cmd/kube-controller-manager", _KUBE_LDFLAGS),
        Program("kube-scheduler", "kubernetes", "k8s.io/kubernetes/cmd/kube-scheduler",
                _KUBE_LDFLAGS),
        Program("kwok", "kwok", "sigs.k8s.io/kwok/cmd/kwok"),
        Program("kueue", "kueue", "sigs.k8s.io/kueue/cmd/kueue"),
        Program("appwrapper", "appwrapper", "github.com/project-codeflare/appwrapper/cmd"),
        Program("helm", "helm", "helm.sh/helm/v3/cmd/helm", _helm_ldflags()),
    )
}
CONTROL_PLANE = [n for n in PROGRAMS if n != "helm"]


class BuildError(RuntimeError):
    """A program could not be built: the message names it and carries Go's output."""


def cache_root() -> Path:
    base = os.environ.get("HEALTHD_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "healthd")
    return Path(base) / "realcluster"


def go_binary() -> str | None:
    return shutil.which("go")


def _go_env() -> dict[str, str]:
    env = dict(os.environ)
    env["GOFLAGS"] = "-mod=readonly -buildvcs=false"  # go.sum decides; nothing is re-resolved
    env["GONOSUMDB"] = ",".join(filter(None, [env.get("GONOSUMDB"), _NOSUMDB]))
    env.setdefault("CGO_ENABLED", "0")
    return env


def _key(program: Program) -> str:
    digest = hashlib.sha256()
    folder = MODULES / program.module
    for path in sorted(folder.iterdir()):
        if path.suffix in (".mod", ".sum", ".go"):
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    digest.update(f"{program.package}\0{program.ldflags}\0{_go_version()}".encode())
    return digest.hexdigest()[:16]


_GO_VERSION: list[str] = []


def _go_version() -> str:
    if not _GO_VERSION:
        out = subprocess.run([go_binary() or "go", "env", "GOVERSION"], capture_output=True,
                             text=True, check=False)
        _GO_VERSION.append(out.stdout.strip())
    return _GO_VERSION[0]


def path_of(name: str) -> Path:
    """Where `name`'s binary is (or will be) for the current pins."""
    program = PROGRAMS[name]
    return cache_root() / f"{name}-{_key(program)}" / name


def is_built(name: str) -> bool:
    return path_of(name).is_file()


def _log(message: str) -> None:
    print(f"[realcluster] {message}", file=sys.stderr, flush=True)


def build(name: str) -> Path:
    """The binary of `name`, built first when the cache has none for these pins."""
    target = path_of(name)
    if target.is_file():
        return target
    if go_binary() is None:
        raise BuildError(f"{name}: no `go` on PATH (Go >= 1.25 builds the real control plane)")
    program = PROGRAMS[name]
    with cache_locked(cache_root()):
        if target.is_file():
            return target
        partial = target.with_name(target.name + ".partial")
        args = [go_binary() or "go", "build", "-trimpath", "-ldflags", f"-s -w {program.ldflags}",
                "-o", str(partial), program.package]
        _log(f"building {name} ({program.package}) ...")
        started = time.monotonic()
        target.parent.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(args, cwd=MODULES / program.module, env=_go_env(),
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise BuildError(f"{name}: `go build {program.package}` failed:\n"
                             f"{(done.stdout + done.stderr)[-4000:]}")
        partial.rename(target)
        _log(f"built {name} in {time.monotonic() - started:.0f} s")
    return target


def build_all(names: list[str] | None = None) -> dict[str, Path]:
    return {name: build(name) for name in (names or list(PROGRAMS))}


def module_dir(module: str, version: str) -> Path:
    """The downloaded source of a pinned module (CRDs and manifests come from there)."""
    folder = MODULES / {"sigs.k8s.io/kueue": "kueue", "sigs.k8s.io/kwok": "kwok",
                        "github.com/project-codeflare/appwrapper": "appwrapper"}[module]
    done = subprocess.run([go_binary() or "go", "mod", "download", "-json", f"{module}@{version}"],
                          cwd=folder, env=_go_env(), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise BuildError(f"go mod download {module}@{version} failed: {done.stderr[-2000:]}")
    return Path(json.loads(done.stdout)["Dir"])
