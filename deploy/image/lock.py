"""Write the image's locks from pyproject.toml: every package the image installs, pinned
with the sha256 of each wheel pip may pick for it on Linux x86_64 and aarch64, CPython 3.11.

    .venv/bin/python deploy/image/lock.py          # rewrite runtime.lock and build.lock
    .venv/bin/python deploy/image/lock.py --check  # exit 1 if they are out of date

- runtime.lock: `[project].dependencies` and everything they need: what /opt/healthd
  holds besides healthd itself (the Containerfile installs it with --require-hashes);
- build.lock: pip and `[build-system].requires`, for the build stage only (they build
  healthd's wheel and never reach the runtime image).

Run it after changing either list in pyproject.toml (tests/image/test_lock.py fails until
then), or to take newer releases. It asks the package index pip is configured for (pip's
own settings and environment apply) and needs Python 3.11 on Linux, as the image has:
environment markers are judged by the interpreter that runs it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
PYPROJECT = ROOT / "pyproject.toml"
LOCKS = {"runtime": HERE / "runtime.lock", "build": HERE / "build.lock"}
PYTHON = "3.11"
ARCHES = ("x86_64", "aarch64")
# glibc 2.36: Debian 12, the base of python:3.11-slim-bookworm and of the Debian-archive
# stand-in.
GLIBC_MINOR = 36
LEGACY = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}


def platform_tags(arch: str) -> list[str]:
    """The platform tags pip accepts on glibc 2.36 for `arch`, best first (as pip on
    that system orders them: newer manylinux first, each legacy alias beside its twin)."""
    tags = []
    for minor in range(GLIBC_MINOR, 4, -1):
        tags.append(f"manylinux_2_{minor}_{arch}")
        if minor in LEGACY and (arch == "x86_64" or minor == 17):
            tags.append(f"{LEGACY[minor]}_{arch}")
    return tags


HEADER = "# {kind}.lock: written by `python deploy/image/lock.py` from pyproject.toml\n"
SOURCE = "# source: {digest}\n"


def requirements(kind: str) -> list[str]:
    """What pyproject.toml asks the image to install, for `kind` (runtime or build)."""
    project = tomllib.loads(PYPROJECT.read_text())
    if kind == "runtime":
        return list(project["project"]["dependencies"])
    return ["pip", *project["build-system"]["requires"]]


def source_digest(kind: str) -> str:
    """A digest of the requirement list a lock was made from: the lock records it, and a
    test compares it with pyproject.toml's list of today."""
    return hashlib.sha256("\n".join(requirements(kind)).encode()).hexdigest()


def resolve(wanted: list[str], arch: str, work: Path) -> dict[str, tuple[str, str]]:
    """{name: (version, sha256)} of what pip would install on Linux `arch`."""
    report = work / f"{arch}.json"
    platforms = [f"--platform={tag}" for tag in platform_tags(arch)]
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--dry-run", "--ignore-installed",
         "--only-binary=:all:", *platforms, "--python-version", PYTHON,
         "--implementation", "cp", "--target", str(work / "target"), "--report", str(report),
         *wanted], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit(f"pip could not resolve for {arch}:\n{proc.stderr}")
    out: dict[str, tuple[str, str]] = {}
    for item in json.loads(report.read_text())["install"]:
        name = item["metadata"]["name"].lower().replace("_", "-")
        hashes = (item.get("download_info", {}).get("archive_info") or {}).get("hashes") or {}
        if "sha256" not in hashes:
            sys.exit(f"the index gave no sha256 for {name} ({item['download_info']['url']})")
        out[name] = (item["metadata"]["version"], hashes["sha256"])
    return out


def render(kind: str) -> str:
    with tempfile.TemporaryDirectory() as folder:
        per_platform = [resolve(requirements(kind), a, Path(folder)) for a in ARCHES]
    versions: dict[str, str] = {}
    hashes: dict[str, set[str]] = {}
    for resolved in per_platform:
        for name, (version, digest) in resolved.items():
            if versions.setdefault(name, version) != version:
                sys.exit(f"{name}: {versions[name]} on one platform, {version} on another")
            hashes.setdefault(name, set()).add(digest)
    lines = [HEADER.format(kind=kind), SOURCE.format(digest=source_digest(kind))]
    for name in sorted(versions):
        pins = " \\\n".join(f"    --hash=sha256:{h}" for h in sorted(hashes[name]))
        lines.append(f"{name}=={versions[name]} \\\n{pins}\n")
    return "".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="compare with the checked-in locks instead of writing them")
    args = parser.parse_args()
    if sys.version_info[:2] != (3, 11) or not sys.platform.startswith("linux"):
        sys.exit("run it with Python 3.11 on Linux (the image's Python): markers are "
                 "judged by this interpreter")
    stale = []
    for kind, path in LOCKS.items():
        text = render(kind)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(path.name)
        else:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    if stale:
        print(f"out of date: {', '.join(stale)} (run python deploy/image/lock.py)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
