"""The model kinds (ppx.models)."""

from ppx import models


def test_traceable_kinds_are_those_that_name_their_blocks():

    for k in models.KINDS:
        assert hasattr(models.kind(k), "block_name") == (k in models.TRACEABLE), k
