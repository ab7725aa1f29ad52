"""Where ppx's own files are: the package folder, the source checkout it runs from (None for
an installed package), and the folders it ships (experiments/, slurm/), which an installed
package holds inside ppx/ (mapped there by pyproject.toml) and a checkout at its top level."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent  # the ppx package folder


def source_checkout() -> Path | None:
    """The ppx checkout this code runs from, or None for an installed package (whose parent
    folders may belong to an unrelated repository)."""
    root = PACKAGE.parent
    return root if (root / "pyproject.toml").is_file() and (root / "ppx" / "__init__.py").is_file() else None


def shipped(folder: str) -> Path:
    """A folder ppx ships (``experiments``, ``slurm``): ppx/<folder> in an installed package,
    else the checkout's <folder> (an editable install, or ppx run from its checkout)."""
    installed = PACKAGE / folder
    return installed if installed.is_dir() else PACKAGE.parent / folder
