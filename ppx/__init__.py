"""ppx: a reproducible experiment harness for pipeline-parallel training in PyTorch."""

__version__ = "0.1.0"
