"""`python -m healthd.sim.apiserver`: run the emulator until interrupted.

Prints the URL and writes a kubeconfig so `kubectl --kubeconfig FILE get nodes`
works against it; `--seed FILE` loads objects from a YAML file (one or many docs,
or `kind: List`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from pathlib import Path
from typing import Any

import yaml

from healthd.sim.apiserver.emulator import ApiEmulator
from healthd.util.exits import UsageParser, port_number


def _objects(path: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for doc in yaml.safe_load_all(path.read_text()):
        if isinstance(doc, dict) and doc.get("kind") == "List":
            out.extend(doc.get("items") or [])
        elif isinstance(doc, list):  # a plain YAML list of objects
            out.extend(item for item in doc if isinstance(item, dict))
        elif isinstance(doc, dict):
            out.append(doc)
    return out


def _parser() -> argparse.ArgumentParser:
    parser = UsageParser(prog="python -m healthd.sim.apiserver",
                         description="Kubernetes API emulator on loopback")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=port_number, default=0, help="0 picks a free port")
    parser.add_argument("--kubeconfig", type=Path, default=Path("emulator.kubeconfig"),
                        help="where to write the kubeconfig (default: %(default)s)")
    parser.add_argument("--seed", type=Path, help="YAML file of objects to load first")
    return parser


async def _serve(args: argparse.Namespace) -> None:
    async with ApiEmulator(host=args.host, port=args.port) as api:
        if args.seed:
            api.seed(*_objects(args.seed))
        path = api.write_kubeconfig(args.kubeconfig)
        print(api.url, flush=True)
        print(f"kubeconfig: {path}  (kubectl --kubeconfig {path} get nodes)", flush=True)
        await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(_serve(args))
    except (OSError, yaml.YAMLError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
