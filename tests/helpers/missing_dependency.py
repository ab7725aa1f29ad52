"""A user's model file that imports a package this machine lacks (model.module's error names it)."""

import ppx_no_such_dependency  # noqa: F401


def build(model):
    raise AssertionError("never reached")
