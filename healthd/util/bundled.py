"""Files shipped inside the package (machine specs, demo scenarios): list them by
name, and let a user name one instead of giving a path."""

from __future__ import annotations

from pathlib import Path

from healthd.util.validation import UnreadableYaml, read_yaml_file


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
    if not path.exists():
        raise UnreadableFile(f"cannot read {what} {path}: No such file or directory (bundled: "
                             f"{', '.join(names(folder))})")
    try:
        return path, read_yaml_file(path, what)
    except UnreadableYaml as exc:
        raise UnreadableFile(str(exc)) from exc
