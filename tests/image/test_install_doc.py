"""The build commands docs/install.md gives users name what the Containerfile has
(stages, build args, secrets, files), and the air-gapped one, on the base made by
deploy/image/debian-base.sh, is the very build the tests run (tests/image/build.py)."""

from __future__ import annotations

import os
import re
import shlex

from tests.deploy.manifests import ROOT
from tests.image import build

INSTALL = ROOT / "docs" / "install.md"


def commands(program: str) -> list[list[str]]:
    """The shell commands in install.md's code blocks that start with `program`
    (continuation lines joined, comments dropped)."""
    blocks = re.findall(r"```sh\n(.*?)```", INSTALL.read_text(), re.DOTALL)
    out = []
    for block in blocks:
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            words = shlex.split(line, comments=True)
            if words[:len(program.split())] == program.split():
                out.append(words)
    return out


def options(words: list[str], flag: str) -> list[str]:
    return [words[i + 1] for i, word in enumerate(words[:-1]) if word == flag]


def test_every_documented_build_names_what_the_containerfile_has() -> None:
    text = build.CONTAINERFILE.read_text()
    stages = set(re.findall(r"^FROM \S+ AS (\S+)$", text, re.MULTILINE))
    args = set(re.findall(r"^ARG (\w+)", text, re.MULTILINE))
    secrets = set(re.findall(r"--mount=type=secret,id=([\w.-]+)", text))
    builds = commands("podman build")
    assert len(builds) >= 4
    for words in builds:
        if "-f" in words:
            assert (ROOT / options(words, "-f")[0]).is_file(), words
        assert set(options(words, "--target")) <= stages, words
        assert {a.split("=")[0] for a in options(words, "--build-arg")} <= args, words
        assert {s.split(",")[0].removeprefix("id=")
                for s in options(words, "--secret")} <= secrets, words


def test_the_air_gapped_build_is_the_one_the_tests_run() -> None:
    (make,) = commands("deploy/image/debian-base.sh")
    script = ROOT / make[0]
    assert script == build.DEBIAN_BASE_SCRIPT and os.access(script, os.X_OK)
    base = make[1]
    (documented,) = [w for w in commands("podman build") if f"PYTHON_IMAGE={base}" in w]
    tested = ["podman", *build.build_args(base)]
    # The tests tag their image by its inputs' digest and build from the clone's root.
    rest = [w for w in documented if w not in tested]
    assert rest == ["-t", options(documented, "-t")[0], "."], rest
    assert set(tested) <= set(documented)
