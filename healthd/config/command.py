"""`healthd config validate FILE`: read a config as the daemons would, and print the
effective config (defaults filled in), or exit 78 naming what is wrong."""

from __future__ import annotations

import argparse
import json

from healthd.config import config_or_exit


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="config_command", required=True, metavar="ACTION",
                                    parser_class=type(parser))
    validate = actions.add_parser("validate",
                                  help="validate a config file, print the effective config")
    validate.add_argument("file")


def run(args: argparse.Namespace) -> int:
    config = config_or_exit(args.file)
    print(f"{args.file}: valid")
    print(json.dumps(config.model_dump(mode="json"), indent=2, sort_keys=True))
    return 0
