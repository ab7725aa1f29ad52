"""Dropout keys (`ppx.models.seeding`): a microbatch's units draw the same whatever ran
before, nothing is seeded outside a microbatch, and the generators get their states back
when the microbatch ends (what draws from them outside it sees no schedule)."""

import torch

from ppx.models.seeding import microbatch, microbatch_key, seed_unit


def test_a_units_draws_follow_its_key_and_the_generator_gets_its_state_back():
    torch.manual_seed(7)
    untouched = torch.rand(3)
    torch.manual_seed(7)
    with microbatch(microbatch_key(5, 0, 0, 1)):
        seed_unit(3)
        first = torch.rand(4)
        seed_unit(4)
        torch.rand(100)  # (more draws in another unit)
    torch.rand(7)  # (whatever runs between)
    with microbatch(microbatch_key(5, 0, 0, 1)):
        seed_unit(3)
        again = torch.rand(4)
        seed_unit(4)
    with microbatch(microbatch_key(5, 0, 0, 2)):  # another microbatch: other masks
        seed_unit(3)
        other = torch.rand(4)
    assert torch.equal(first, again) and not torch.equal(first, other)
    torch.manual_seed(7)
    with microbatch(microbatch_key(5, 0, 0, 1)):
        seed_unit(3)
    assert torch.equal(torch.rand(3), untouched)  # the state the microbatch found


def test_nothing_is_seeded_outside_a_microbatch():
    torch.manual_seed(11)
    want = torch.rand(2)
    torch.manual_seed(11)
    seed_unit(0)  # (a trial forward, a check: no key)
    with microbatch(None):
        seed_unit(1)
    assert torch.equal(torch.rand(2), want)
    keys = {microbatch_key(s, st, r, m) for s in (0, 1) for st in (0, 1) for r in (0, 1) for m in (0, 1)}
    assert len(keys) == 16  # seed, step, replica and microbatch each change the key
