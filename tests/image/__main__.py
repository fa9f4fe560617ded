"""`python -m tests.image build`: build (or find in the cache) the image the tests run,
print its name and the base it was built on. Exit 1 with the reason when it cannot."""

from __future__ import annotations

import argparse
import sys

from tests.image import build


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.image")
    verbs = parser.add_subparsers(dest="verb", required=True)
    verbs.add_parser("build", help="build (or reuse) the slim image the tests run")
    parser.parse_args(argv)
    try:
        built = build.build()
    except build.Unavailable as exc:
        print(f"image: {exc}", file=sys.stderr)
        return 1
    print(f"image: {built.describe()}", file=sys.stderr)
    print(built.image)
    return 0


if __name__ == "__main__":
    sys.exit(main())
