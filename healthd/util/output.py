"""`-o/--output`, as kubectl spells it, for every command that prints a result.

`table` is for people; `wide` is the same table with every column and nothing
clipped; `json` and `yaml` print the command's document (the same data as the
table), for scripts. One place defines the choices and how a document is printed,
so every command accepts and prints them alike.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import Any

import yaml

TABLE, WIDE, JSON, YAML = "table", "wide", "json", "yaml"
FORMATS = (TABLE, WIDE, JSON, YAML)


def add_output_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", choices=FORMATS, default=TABLE,
                        help="table (default), wide (every column, nothing clipped), "
                             "json or yaml (the whole result, for scripts)")


def is_document(output: str) -> bool:
    """Whether `output` prints the document rather than a table."""
    return output in (JSON, YAML)


def dump(doc: Mapping[str, Any], output: str, *, compact: bool = False) -> str:
    """`doc` as JSON (indented, or one line when `compact`) or as one YAML document
    (`compact` starts it with `---`, so a stream of them parses)."""
    if output == YAML:
        text = yaml.safe_dump(dict(doc), sort_keys=False, allow_unicode=True).rstrip("\n")
        return f"---\n{text}" if compact else text
    return json.dumps(doc, indent=None if compact else 2)
