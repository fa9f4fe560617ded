"""The image's locks (deploy/image/*.lock) against pyproject.toml: every runtime
dependency pinned at a version pyproject allows, every pin with its wheels' sha256, the
locks made from today's requirement lists (`python deploy/image/lock.py` after any
change), no installer in the runtime's lock; and the Containerfile installs from them
with --require-hashes."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.deploy.manifests import ROOT

# deploy/image/lock.py, the script that writes the locks: the same rules, read here.
_SPEC = importlib.util.spec_from_file_location("lock", ROOT / "deploy" / "image" / "lock.py")
assert _SPEC and _SPEC.loader
lock = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(lock)

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+) \\$")
HASH = re.compile(r"^    --hash=sha256:([0-9a-f]{64})( \\)?$")


def pins(path: Path) -> dict[str, tuple[str, list[str]]]:
    """{name: (version, [sha256, ...])} of a lock, checking its format line by line."""
    out: dict[str, tuple[str, list[str]]] = {}
    current = ""
    for line in path.read_text().splitlines():
        if line.startswith("#") or not line:
            continue
        if match := PIN.match(line):
            current = canonicalize_name(match.group(1))
            assert current not in out, f"{path.name}: {current} pinned twice"
            out[current] = (match.group(2), [])
            continue
        match = HASH.match(line)
        assert match and current, f"{path.name}: not a pin or a hash: {line!r}"
        out[current][1].append(match.group(1))
    return out


def test_each_lock_was_made_from_pyprojects_requirements_of_today() -> None:
    for kind, path in lock.LOCKS.items():
        recorded = re.search(r"^# source: ([0-9a-f]{64})$", path.read_text(), re.MULTILINE)
        assert recorded, f"{path.name} has no source line"
        assert recorded.group(1) == lock.source_digest(kind), (
            f"pyproject.toml's {kind} requirements changed since {path.name} was written: "
            "run `python deploy/image/lock.py`")


def test_every_runtime_dependency_is_pinned_at_a_version_pyproject_allows() -> None:
    for kind, path in lock.LOCKS.items():
        pinned = pins(path)
        for text in lock.requirements(kind):
            requirement = Requirement(text)
            name = canonicalize_name(requirement.name)
            assert name in pinned, f"{path.name} lacks {name} ({text} in pyproject.toml)"
            version, hashes = pinned[name]
            assert requirement.specifier.contains(version, prereleases=True), (
                f"{path.name} pins {name}=={version}; pyproject.toml asks {text}")
            assert hashes, f"{path.name}: {name} has no hash"
        assert all(hashes for _, hashes in pinned.values())


def test_the_runtime_gets_no_installer_and_the_build_gets_pip_and_its_backend() -> None:
    runtime, build = pins(lock.LOCKS["runtime"]), pins(lock.LOCKS["build"])
    assert not {"pip", "setuptools", "wheel"} & set(runtime)
    assert {"pip", "setuptools"} <= set(build)


def test_the_containerfile_installs_only_from_the_locks_checking_hashes() -> None:
    text = re.sub(r"\\\n\s*", " ", (ROOT / "Containerfile").read_text())
    installs = [line for line in text.splitlines()
                if "pip" in line and " install " in line and not line.lstrip().startswith("#")]
    commands = [c for line in installs for c in line.split("&&") if " install " in c]
    from_index = [c for c in commands if "--no-index" not in c]
    assert from_index, "no install from the index: the locks are not used"
    for command in from_index:
        assert "--require-hashes" in command and "--requirement" in command, command
    assert "--requirement build.lock" in text and "--requirement runtime.lock" in text
    # healthd's own wheel, built in the image, comes from no index at all.
    assert [c for c in commands if "--no-index" in c and "--no-deps" in c]
