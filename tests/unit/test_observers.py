"""One rule for observers (before in order, after in reverse) and the known-cost clock each
executor owns."""

from __future__ import annotations

import time

import pytest

from ppx.engine.observers import run_observed
from ppx.models.action_clock import ActionClock
from ppx.schedules.comms.program import Item
from ppx.schedules.ir.action import Action, Op

ITEM = Item("compute", (Action(0, Op.F, 0),), "0F0")


class Log:
    def __init__(self, name, out):
        self.name, self.out = name, out

    def before(self, item):
        self.out.append(f"{self.name}.before({item.label})")

    def after(self, item):
        self.out.append(f"{self.name}.after({item.label})")


def test_observers_nest_like_context_managers():
    out = []
    result = run_observed([Log("a", out), Log("b", out)], ITEM, lambda x: out.append("work") or x * 2, 21)
    assert result == 42
    assert out == ["a.before(0F0)", "b.before(0F0)", "work", "b.after(0F0)", "a.after(0F0)"]


def test_an_item_that_raises_skips_the_afters():
    out = []

    def fail():
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        run_observed([Log("a", out)], ITEM, fail)
    assert out == ["a.before(0F0)"]


@pytest.mark.timing
def test_the_clock_makes_an_action_last_its_charge():
    clock = ActionClock()
    assert not clock.charge(0.01)  # no action runs: the caller waits in place
    start = time.perf_counter()
    with clock.action("input"):
        assert clock.part == "input"
        assert clock.charge(0.03) and clock.charge(0.02)
    took = time.perf_counter() - start
    assert clock.part == "full"
    assert 0.05 <= took < 0.5, took


def test_two_clocks_do_not_share_an_action():
    a, b = ActionClock(), ActionClock()
    a.begin("weight")
    assert not b.charge(1.0) and b.part == "full"
    a.end()
