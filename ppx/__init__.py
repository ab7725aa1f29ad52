"""ppx: a reproducible experiment harness for pipeline-parallel training in PyTorch."""

__version__ = "0.1.0"


def version() -> str:
    """ppx's version: the installed package's metadata, else `__version__` (a checkout not installed)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("ppx")
    except PackageNotFoundError:
        return __version__
