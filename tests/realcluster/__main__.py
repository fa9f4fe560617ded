"""`python -m tests.realcluster build [PROGRAM...]`: build (or reuse) the pinned programs.

Other verbs (`up`, `down`, `env`) start and stop the control plane by hand.
"""

from __future__ import annotations

import argparse
import sys

from tests.realcluster import programs


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.realcluster")
    verbs = parser.add_subparsers(dest="verb", required=True)
    build = verbs.add_parser("build", help="build (or reuse) the pinned programs")
    build.add_argument("programs", nargs="*", metavar="PROGRAM",
                       help=f"any of: {', '.join(programs.PROGRAMS)} (default: all)")
    build.set_defaults(run=_build)
    args = parser.parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
