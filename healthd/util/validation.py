"""How a file a person wrote reads: its YAML, whatever bytes it holds, and a pydantic
validation error as `field.path: what is wrong`, one clause per problem. Config
files, machine specs and demo scenarios all say it this way."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError


class UnreadableYaml(ValueError):
    """A file that cannot be read or is not YAML; the message names it and why."""


def read_yaml_file(path: Path, what: str) -> object:
    """The parsed YAML of `path`; UnreadableYaml for a file that cannot be read, is
    not UTF-8 text, is not YAML or nests too deeply, never another exception. `what`
    names the kind of file in messages ("config", "machine spec")."""
    try:
        return yaml.safe_load(path.read_bytes().decode("utf-8"))
    except OSError as exc:
        raise UnreadableYaml(f"cannot read {what} {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise UnreadableYaml(f"{what} {path} is not UTF-8 text (byte "
                             f"0x{exc.object[exc.start]:02x} at offset {exc.start}): is it "
                             "the right file?") from None
    except yaml.YAMLError as exc:
        raise UnreadableYaml(f"{what} {path} is not valid YAML: {exc}") from exc
    except RecursionError:
        raise UnreadableYaml(f"{what} {path} nests too deeply") from None


def explain(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"])
        message = err["msg"].removeprefix("Value error, ")
        named = not where or message.startswith((f"{where}.", f"{where}:"))
        parts.append(message if named else f"{where}: {message}")
    return "; ".join(parts)
