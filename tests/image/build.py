"""healthd's image built with podman for the tests, as a user builds it.

The `slim` target of `Containerfile`, on the real Python base when this machine has it
or can pull it, else on a base made from Debian's archive by
`deploy/image/debian-base.sh` (the script docs/install.md gives air-gapped sites). Both
live in a podman storage of the tests' own under the cache (`~/.cache/healthd/image`,
or `$HEALTHD_CACHE/image`): the image is tagged with a digest of everything that goes
into it (the Containerfile, the locks, the sources, the base), so a second run with
nothing changed finds it in a second, and a change rebuilds what the change touches.

pip's settings on this machine (its index, its CA bundle: `pip config list`, which
includes PIP_* variables) reach the build as build secrets, never a layer.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tests.cachelock import cache_locked

ROOT = Path(__file__).resolve().parents[2]
CONTAINERFILE = ROOT / "Containerfile"
IMAGE_DIR = ROOT / "deploy" / "image"
DEBIAN_BASE_SCRIPT = IMAGE_DIR / "debian-base.sh"
SOURCES = ("pyproject.toml", "README.md", "checks", "healthd")
TARGET = "slim"
REPOSITORY = "localhost/healthd-test"
DEBIAN_BASE = "localhost/healthd-base"
PULL_TIMEOUT_S = 120
BUILD_TIMEOUT_S = 1200


class Unavailable(RuntimeError):
    """The image cannot be built here; the message says why."""


@dataclasses.dataclass(frozen=True)
class Built:
    image: str  # the tag to run
    base: str  # the image it was built on
    base_kind: str  # "python": the real base; "debian": made from Debian's archive
    seconds: float  # what this call took (a cached image: about a second)
    cached: bool

    def describe(self) -> str:
        what = ("the real Python base" if self.base_kind == "python"
                else "a base made from Debian's archive (deploy/image/debian-base.sh)")
        how = "cached" if self.cached else "built"
        return f"{self.image} ({how} in {self.seconds:.0f} s on {what}: {self.base})"


def cache_root() -> Path:
    base = os.environ.get("HEALTHD_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "healthd")
    return Path(base) / "image"


def default_python_image() -> str:
    """The PYTHON_IMAGE the Containerfile names by default."""
    match = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", CONTAINERFILE.read_text(), re.MULTILINE)
    assert match, "Containerfile: no default PYTHON_IMAGE"
    return match.group(1)


KEEP_OTHER_SOURCES = 2  # images of other sources kept beside the current one


def podman_binary() -> str | None:
    return shutil.which("podman")


def why_not() -> str | None:
    """Why this machine cannot build the image, or None when it can try."""
    if podman_binary() is None:
        return ("needs podman on PATH (Debian package podman; the README's test command "
                "installs it as root)")
    if os.geteuid() != 0:
        return "needs root (podman's storage and the Debian-archive base are made as root)"
    return None


# -- podman with settings of the tests' own -------------------------------------------


def engine_env() -> dict[str, str]:
    """The environment for podman: a storage and a containers.conf of the tests' own."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    storage = root / "storage.conf"
    # The run state (locks, mounts) on tmpfs, one folder per storage.
    runroot = Path("/run/healthd-image") / hashlib.sha256(str(root).encode()).hexdigest()[:12]
    storage.write_text(
        '[storage]\ndriver = "overlay"\n'
        f'graphroot = "{root / "storage"}"\nrunroot = "{runroot}"\n')
    lines = ["[containers]",
             # podman's default ulimits are above what some machines allow even root to
             # set (no CAP_SYS_RESOURCE): a container inherits podman's own instead.
             "default_ulimits = []", "[engine]"]
    # crun refuses hybrid cgroup layouts that runc handles: runc when it is installed.
    if shutil.which("runc"):
        lines.append('runtime = "runc"')
    conf = root / "containers.conf"
    conf.write_text("\n".join(lines) + "\n")
    return {**os.environ, "CONTAINERS_CONF": str(conf), "CONTAINERS_STORAGE_CONF": str(storage)}


def podman(*args: str, timeout: float = 300, check: bool = True,
           ) -> subprocess.CompletedProcess[str]:
    binary = podman_binary()
    if binary is None:
        raise Unavailable(why_not() or "no podman")
    proc = subprocess.run([binary, *args], capture_output=True, text=True, timeout=timeout,
                          env=engine_env(), cwd=ROOT, check=False)
    if check and proc.returncode != 0:
        raise Unavailable(f"podman {' '.join(args[:2])} failed ({proc.returncode}): "
                          f"{proc.stderr.strip()[-2000:]}")
    return proc


def image_id(name: str) -> str | None:
    proc = podman("image", "inspect", "--format", "{{.Id}}", name, check=False)
    return proc.stdout.strip() if proc.returncode == 0 else None


# -- what goes into the image ---------------------------------------------------------


def source_files() -> list[Path]:
    files = [CONTAINERFILE, *sorted(IMAGE_DIR.glob("*.lock"))]
    for name in SOURCES:
        path = ROOT / name
        files += [path] if path.is_file() else sorted(
            p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    return files


def inputs_digest(base_id: str) -> str:
    digest = hashlib.sha256(f"{TARGET}\0{base_id}\0".encode())
    for path in source_files():
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def debian_base_name() -> str:
    """The Debian-archive base's tag: a digest of the script that makes it."""
    return f"{DEBIAN_BASE}:{hashlib.sha256(DEBIAN_BASE_SCRIPT.read_bytes()).hexdigest()[:16]}"


def choose_base(log: list[str]) -> tuple[str, str]:
    """(image, kind): the real base if here or pullable, else the Debian-archive base
    (made once). A machine that has made the Debian base never asks a registry again
    for the same script."""
    real = default_python_image()
    debian = debian_base_name()
    if image_id(real):
        return real, "python"
    if image_id(debian):
        return debian, "debian"
    pull = podman("pull", "--quiet", real, timeout=PULL_TIMEOUT_S, check=False)
    if pull.returncode == 0:
        return real, "python"
    reason = (pull.stderr.strip().splitlines() or ["no answer"])[-1]
    log.append(f"cannot pull {real} ({reason}): making a base from Debian's archive")
    print(f"image: {log[-1]}", file=sys.stderr)
    proc = subprocess.run([str(DEBIAN_BASE_SCRIPT), debian], capture_output=True, text=True,
                          timeout=BUILD_TIMEOUT_S, env=engine_env(), check=False)
    if proc.returncode != 0:
        raise Unavailable(f"{DEBIAN_BASE_SCRIPT.name} failed ({proc.returncode}): "
                          f"{proc.stderr.strip()[-2000:]}")
    return debian, "debian"


# -- pip's settings, as build secrets ----------------------------------------------------


def pip_settings() -> dict[str, str]:
    """`pip config list` of this interpreter's pip: {'global.cert': '/etc/...', ...}
    (environment variables come as ':env:.cert')."""
    proc = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True,
                          text=True, timeout=60, check=False)
    files: dict[str, str] = {}
    env: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        key, sep, value = line.partition("=")
        value = value.strip().strip("'\"")
        if not sep:
            continue
        if key.startswith(":env:."):  # a PIP_* variable: it wins over the files
            env[f"global.{key[len(':env:.'):]}"] = value
        else:
            files.setdefault(key if "." in key else f"global.{key}", value)
    out = {**files, **env}
    return out


def pip_secrets(folder: Path) -> list[str]:
    """`--secret` arguments carrying this machine's pip settings into the build: a
    pip.conf, and the CA bundle it names (as /run/secrets/pip-ca). Settings naming
    this machine's files (other than the CA bundle) stay out: the build cannot see them."""
    settings = pip_settings()
    sections: dict[str, dict[str, str]] = {}
    args: list[str] = []
    for key, value in settings.items():
        section, _, name = key.partition(".")
        if name == "cert" and Path(value).is_file():
            shutil.copyfile(value, folder / "pip-ca")
            args += ["--secret", f"id=pip-ca,src={folder / 'pip-ca'}"]
            value = "/run/secrets/pip-ca"
        elif value.startswith("/") or name in ("client-cert", "log", "cache-dir"):
            continue
        sections.setdefault(section, {})[name] = value
    if sections:
        text = "".join(f"[{section}]\n" + "".join(f"{k} = {v}\n" for k, v in items.items())
                       for section, items in sections.items())
        (folder / "pip.conf").write_text(text)
        args += ["--secret", f"id=pip.conf,src={folder / 'pip.conf'}"]
    return args


# -- the build --------------------------------------------------------------------------


def build_args(base: str) -> list[str]:
    """The build, as docs/install.md tells an air-gapped site to run it."""
    return ["build", "--target", TARGET, "--build-arg", f"PYTHON_IMAGE={base}",
            "-f", CONTAINERFILE.name]  # podman runs in the clone's root


def run_build(args: list[str], context: Path = ROOT) -> None:
    """`podman build ARGS CONTEXT` with this machine's pip settings as secrets."""
    work = cache_root() / "secrets"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(mode=0o700)
    try:
        proc = podman(*args, *pip_secrets(work), str(context), timeout=BUILD_TIMEOUT_S,
                      check=False)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if proc.returncode != 0:
        raise Unavailable(f"podman build failed ({proc.returncode}):\n"
                          f"{(proc.stdout + proc.stderr).strip()[-3000:]}")


def build_default(built: Built, dcgm_image: str, tag: str) -> None:
    """The default (last) stage on `built`'s base, with `dcgm_image` as DCGM's image."""
    args = build_args(built.base)
    args[args.index("--target"):args.index("--target") + 2] = []
    with cache_locked(cache_root()):
        run_build([*args, "--build-arg", f"DCGM_IMAGE={dcgm_image}", "-t", tag])


def build(*, force: bool = False, tag: str | None = None) -> Built:
    """The image for these sources (built now, or the cached one), or Unavailable.
    `force`: build again without podman's layer cache, under `tag`."""
    reason = why_not()
    if reason:
        raise Unavailable(reason)
    started = time.monotonic()
    log: list[str] = []
    with cache_locked(cache_root()):
        base, kind = choose_base(log)
        base_id = image_id(base)
        assert base_id, base
        name = tag or f"{REPOSITORY}:{inputs_digest(base_id)}"
        if not force and image_id(name):
            return Built(name, base, kind, time.monotonic() - started, cached=True)
        run_build([*build_args(base), "-t", name, *(["--no-cache"] if force else [])])
        if tag is None:
            _forget_older(name, base)
        return Built(name, base, kind, time.monotonic() - started, cached=False)


def _forget_older(keep: str, base: str) -> None:
    """Images of older sources of this cache (the newest few stay: another checkout's
    test run may be using its own right now), Debian-archive bases of older scripts,
    and layers nothing uses any more."""
    for repository, current, spared in ((REPOSITORY, keep, KEEP_OTHER_SOURCES),
                                        (DEBIAN_BASE, base, 0)):
        proc = podman("images", "--sort", "created", "--format", "{{.Repository}}:{{.Tag}}",
                      repository, check=False)  # newest first
        others = [name for name in proc.stdout.split()
                  if name != current and name.startswith(f"{repository}:")]
        for name in others[spared:]:
            podman("rmi", "--force", name, check=False)
    podman("image", "prune", "--force", check=False)


def installed_packages(image: str) -> dict[str, str]:
    """{distribution: its RECORD's sha256} in the image's virtualenv: what was installed,
    file by file (RECORD lists every file a wheel put there, with its hash)."""
    script = (
        "import hashlib, importlib.metadata as m, json, sys\n"
        "out = {}\n"
        "for d in m.distributions():\n"
        "    record = d.read_text('RECORD') or ''\n"
        "    key = f\"{d.metadata['Name']}=={d.version}\"\n"
        "    out[key] = hashlib.sha256(record.encode()).hexdigest()\n"
        "json.dump(out, sys.stdout, sort_keys=True)\n")
    proc = podman("run", "--rm", "--network", "none", "--entrypoint", "python", image,
                  "-c", script, timeout=120)
    result: dict[str, str] = json.loads(proc.stdout)
    return result


def remove(image: str) -> None:
    podman("rmi", "--force", image, check=False)
