"""Files shipped inside the package (machine specs, demo scenarios): list them by
name, and let a user name one instead of giving a path."""

from __future__ import annotations

from pathlib import Path


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
