"""`python -m tests.realcluster build [PROGRAM...]`: build (or reuse) the pinned programs.

Other verbs (`up`, `down`, `env`) start and stop the control plane by hand.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from tests.realcluster import programs
from tests.realcluster.cluster import ControlPlane, stop_saved


def _build(args: argparse.Namespace) -> int:
    unknown = sorted(set(args.programs) - set(programs.PROGRAMS))
    if unknown:
        print(f"realcluster: unknown program(s) {', '.join(unknown)}; "
              f"known: {', '.join(programs.PROGRAMS)}", file=sys.stderr)
        return 64
    try:
        for name, path in programs.build_all(args.programs or None).items():
            print(f"{name}\t{path}")
    except programs.BuildError as exc:
        print(f"realcluster: {exc}", file=sys.stderr)
        return 1
    return 0


def _default_dir() -> Path:
    return programs.cache_root() / "run"


def _up(args: argparse.Namespace) -> int:
    folder = Path(args.dir)
    if (folder / "state.json").exists():
        print(f"realcluster: a control plane is already up in {folder} "
              f"(`python -m tests.realcluster down` first)", file=sys.stderr)
        return 1
    plane = ControlPlane(folder)
    try:
        plane.start()
    except Exception as exc:
        plane.stop()
        print(f"realcluster: {exc}", file=sys.stderr)
        return 1
    plane.save_state()
    print(f"export KUBECONFIG={plane.admin_kubeconfig}")
    print(f"# API server {plane.server}; logs in {plane.logs}", file=sys.stderr)
    return 0


def _down(args: argparse.Namespace) -> int:
    folder = Path(args.dir)
    state = folder / "state.json"
    if not state.exists():
        print(f"realcluster: nothing is up in {folder}", file=sys.stderr)
        return 0
    stopped = stop_saved(state)
    shutil.rmtree(folder, ignore_errors=True)
    print(f"stopped: {', '.join(stopped) or 'nothing was running'}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.realcluster")
    verbs = parser.add_subparsers(dest="verb", required=True)
    build = verbs.add_parser("build", help="build (or reuse) the pinned programs")
    build.add_argument("programs", nargs="*", metavar="PROGRAM",
                       help=f"any of: {', '.join(programs.PROGRAMS)} (default: all)")
    build.set_defaults(run=_build)
    for verb, run, text in (("up", _up, "start a control plane; print its KUBECONFIG"),
                            ("down", _down, "stop the control plane `up` started")):
        sub = verbs.add_parser(verb, help=text)
        sub.add_argument("--dir", default=str(_default_dir()),
                         help="its certificates, data and logs (default: %(default)s)")
        sub.set_defaults(run=run)
    args = parser.parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
