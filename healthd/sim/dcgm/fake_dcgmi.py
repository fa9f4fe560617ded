#!/usr/bin/env python3
"""A stand-in for `dcgmi` that replays a recorded `dcgmi diag -j` output.

It exercises the real subprocess path of the dcgm check (process groups, deadlines,
exit statuses, parsing) with no GPU and no DCGM installed. Its own options come
first, then the dcgmi arguments it stands in for (which must start with `diag`):

    fake_dcgmi.py --output v4-fail-r3 [--exit 226] [--sleep 5] [--noise]
                  [--stderr TEXT] [--pid-file F] [--grandchild]
                  [--host-engine ADDR]  diag [--host ADDR] -r 3 -j

`--output` is a recorded name (a file in `outputs/`, see `outputs/index.json`) or a
path; `--text` prints the given text instead (a recording kept inline in a machine
spec). `--version` answers like `dcgmi --version`, with `--dcgm-version`'s number.
Without `--exit` it exits with the status the recording was taken with.
`--sleep inf` never finishes (for timeout tests); `--grandchild` first starts a
sleeping child in the same process group, and `--pid-file` records both pids, so a
test can prove the whole group dies. `--host-engine ADDR` says where the host engine
listens (`none`: nowhere): a `diag` whose `--host` (default `localhost`) is not ADDR
fails as dcgmi does when it cannot connect. Standard library only: it must start fast.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

OUTPUTS = Path(__file__).resolve().parent / "outputs"
INDEX = OUTPUTS / "index.json"
EXIT_BAD_ARGS = 254  # what dcgmi returns for arguments it does not understand
EXIT_NO_CONNECTION = 255
NO_CONNECTION = "Error: unable to establish a connection to the specified host: {host}"

BANNER = "Successfully ran diagnostic for group.\n"
TRAILER = "Note: the full diagnostic log is in the DCGM log directory.\n"


def recorded_names() -> dict[str, dict[str, object]]:
    """name -> {"file", "exit", "about"} for every recording."""
    loaded: dict[str, dict[str, object]] = json.loads(INDEX.read_text())
    return loaded


def resolve(output: str) -> tuple[Path, int]:
    """The file to print and its recorded exit status (0 for an ad-hoc path)."""
    entry = recorded_names().get(output)
    if entry is not None:
        return OUTPUTS / str(entry["file"]), int(str(entry["exit"]))
    path = Path(output)
    if not path.is_file():
        raise FileNotFoundError(f"no recorded output or file named {output!r}")
    return path, 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fake-dcgmi", description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="", help="recorded name or file path")
    parser.add_argument("--text", default=None, help="print this instead of --output")
    parser.add_argument("--dcgm-version", default="4.2.3", help="version --version shows")
    parser.add_argument("--version", action="store_true", help="print the version, exit 0")
    parser.add_argument("--exit", type=int, default=None, help="exit status to use")
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds to wait first")
    parser.add_argument("--noise", action="store_true", help="print junk around the JSON")
    parser.add_argument("--stderr", default="", help="text to print on stderr")
    parser.add_argument("--pid-file", default=None, help="append own (and grandchild) pid")
    parser.add_argument("--grandchild", action="store_true", help="start a sleeping child")
    parser.add_argument("--host-engine", default=None,
                        help="address the host engine listens on (none: nowhere)")
    parser.add_argument("dcgmi_args", nargs=argparse.REMAINDER, help="diag -r N -j ...")
    return parser


def _spawn_grandchild() -> int:
    child = subprocess.Popen(  # same process group: it must die with us
        [sys.executable, "-c", "import time; time.sleep(3600)"],
        stdin=subprocess.DEVNULL,
        stdout=sys.stdout,
        stderr=sys.stderr,
    )
    return child.pid


def _record_pids(pid_file: str | None, pids: list[int]) -> None:
    if pid_file:
        with open(pid_file, "a") as fh:
            fh.write("".join(f"{p}\n" for p in pids))


def _sleep(seconds: float) -> None:
    while seconds > 0:
        step = min(seconds, 3600.0)
        time.sleep(step)
        seconds -= step


def _host_arg(dcgmi_args: list[str]) -> str:
    """The `--host` dcgmi was given, `localhost` (dcgmi's default) without one."""
    if "--host" in dcgmi_args[:-1]:
        return dcgmi_args[dcgmi_args.index("--host") + 1]
    return "localhost"


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.version:
        print(f"dcgmi  version: {args.dcgm_version}")
        return 0
    if not args.dcgmi_args or args.dcgmi_args[0] != "diag":
        print("Error: fake dcgmi only knows `diag`", file=sys.stderr)
        return EXIT_BAD_ARGS
    host = _host_arg(args.dcgmi_args)
    if args.host_engine is not None and host != args.host_engine:
        print(NO_CONNECTION.format(host=host), file=sys.stderr)
        return EXIT_NO_CONNECTION
    try:
        path, recorded_exit = (None, 0) if args.text is not None else resolve(args.output)
    except (OSError, ValueError) as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return EXIT_BAD_ARGS
    pids = [os.getpid()]
    if args.grandchild:
        pids.append(_spawn_grandchild())
    _record_pids(args.pid_file, pids)
    _sleep(args.sleep)
    body = args.text if path is None else path.read_text()
    out = f"{BANNER}{body}\n{TRAILER}" if args.noise else body
    sys.stdout.write(out)
    sys.stdout.flush()
    if args.stderr:
        print(args.stderr, file=sys.stderr)
    return recorded_exit if args.exit is None else args.exit


if __name__ == "__main__":
    sys.exit(main())
