"""The default (last) stage on this machine's architecture: NVIDIA's DCGM image cannot be
pulled here, so a stand-in with its layout (dcgmi in /usr/bin, libdcgm in the
architecture's multiarch folder) takes its place. The image then runs dcgmi from its
PATH and has the library where dcgmi's loader looks, whichever the architecture."""

from __future__ import annotations

import platform
import uuid
from pathlib import Path

from tests.image import build


def test_the_default_stage_takes_dcgmi_and_its_library_from_this_architectures_folders(
        image: build.Built, tmp_path: Path) -> None:
    libdir = f"/usr/lib/{platform.machine()}-linux-gnu"
    context = tmp_path / "dcgm"
    context.mkdir()
    (context / "dcgmi").write_text('#!/bin/sh\necho "dcgmi stand-in: $*"\n')
    (context / "dcgmi").chmod(0o755)
    (context / "libdcgm.so.4").write_text("a stand-in for DCGM's library\n")
    (context / "Containerfile").write_text(
        f"FROM {image.base}\n"
        "COPY dcgmi /usr/bin/dcgmi\n"
        f"COPY libdcgm.so.4 {libdir}/libdcgm.so.4\n"
        f"RUN ln -s libdcgm.so.4 {libdir}/libdcgm.so\n")
    suffix = uuid.uuid4().hex[:6]
    stand_in, default = f"localhost/dcgm-stand-in:{suffix}", f"{build.REPOSITORY}:default-{suffix}"
    try:
        build.podman("build", "-t", stand_in, str(context), timeout=300)
        build.build_default(image, stand_in, default)
        proc = build.podman("run", "--rm", "--network", "none", "--entrypoint", "sh", default,
                            "-c", f"dcgmi --version && ls {libdir} | grep dcgm && healthd "
                                  "--version && id -u")
    finally:
        build.remove(default)
        build.remove(stand_in)
    assert proc.stdout.split("\n") == [
        "dcgmi stand-in: --version", "libdcgm.so", "libdcgm.so.4", "healthd 0.1.0", "10001", ""]
