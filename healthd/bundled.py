"""Files shipped inside the package (machine specs, demo scenarios): list them by
name, and let a user name one instead of giving a path."""

from __future__ import annotations

from pathlib import Path

import yaml


def names(folder: Path) -> list[str]:
    """The YAML files in `folder`, by name without `.yaml`."""
    return sorted(p.stem for p in folder.glob("*.yaml"))


def resolve(source: str | Path, folder: Path) -> Path:
    """`source` as a path when it is one (it exists, or has a suffix), else the
    bundled file of that name in `folder` if there is one."""
    path = Path(source)
    if path.exists() or path.suffix:
        return path
    bundled = folder / f"{source}.yaml"
    return bundled if bundled.exists() else path


class UnreadableFile(ValueError):
    """A file that cannot be read or is not YAML; the message says which and why."""


def read_yaml(source: str | Path, folder: Path, what: str) -> tuple[Path, object]:
    """The parsed YAML of `source` (a path or a bundled name), with its path. `what`
    names the kind of file in messages ("machine spec", "scenario")."""
    path = resolve(source, folder)
    try:
        return path, yaml.safe_load(path.read_text())
    except OSError as exc:
        raise UnreadableFile(f"cannot read {what} {path}: {exc.strerror} (bundled: "
                             f"{', '.join(names(folder))})") from exc
    except yaml.YAMLError as exc:
        raise UnreadableFile(f"{what} {path} is not valid YAML: {exc}") from exc
