"""ppx: a reproducible experiment harness for pipeline-parallel training in PyTorch."""

__version__ = "0.1.0"  # (pyproject.toml's: tests/e2e/test_first_steps.py holds them equal)
