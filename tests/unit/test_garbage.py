"""Garbage collection kept out of timed steps (`ppx.engine.garbage`): no collection starts
inside a step however much cyclic garbage it makes, each runs between steps, and Python's
own state comes back afterwards."""

from __future__ import annotations

import gc

import pytest

from ppx import config
from ppx.engine.garbage import StepCollector
from ppx.errors import UserError


def _cycles(n: int) -> None:
    for _ in range(n):
        a: list = []
        a.append(a)  # garbage only a collection frees


@pytest.fixture
def collections():
    """Every collection that starts, as ("in step" | "between", generation)."""
    where = {"now": "between"}
    seen: list = []

    def callback(phase, info):
        if phase == "start":
            seen.append((where["now"], info["generation"]))

    gc.callbacks.append(callback)
    yield where, seen
    gc.callbacks.remove(callback)


def test_no_collection_inside_a_step_one_between_each(collections):
    where, seen = collections
    assert gc.isenabled()
    with StepCollector(1) as collector:
        assert not gc.isenabled()
        seen.clear()  # the one on entering
        for step in range(3):
            where["now"] = "in step"
            _cycles(50_000)  # far past the automatic threshold (700 allocations)
            where["now"] = "between"
            collector.between_steps(step)
    assert gc.isenabled() and not gc.get_freeze_count()
    assert seen == [("between", 2)] * 3


def test_every_k_steps(collections):
    _, seen = collections
    with StepCollector(2) as collector:
        seen.clear()
        for step in range(5):
            collector.between_steps(step)
    assert len(seen) == 2  # after steps 1 and 3


def test_zero_leaves_automatic_collection(collections):
    where, seen = collections
    with StepCollector(0) as collector:
        assert gc.isenabled()
        where["now"] = "in step"
        _cycles(50_000)
        collector.between_steps(0)
    assert ("in step", 0) in seen  # Python's own: inside the "step", as without ppx


def test_negative_is_refused():
    assert config.load("gpipe_2cpu", []).runtime.gc_steps == 1
    with pytest.raises(UserError, match="runtime.gc_steps must be >= 0"):
        config.load("gpipe_2cpu", ["runtime.gc_steps=-1"])
