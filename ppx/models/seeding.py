"""Deterministic initialisation: every block is built under its own seed, so the weights of
block i are the same whatever the stage count or split. And deterministic dropout: a unit's
random ops (dropout masks) draw from a seed of (run seed, step, replica, microbatch, unit), so
they are the same whatever the schedule, the stage count or a recomputation of the forward
(`microbatch`, `seed_unit`)."""

from __future__ import annotations

import contextlib

import torch

EMBEDDING, HEAD, TEACHER, DATA = 1, 2, 3, 4  # tags for the non-block parts (hf.py: 5, GPT-2's positions)
DROPOUT = 6  # the tag under which microbatches key their dropout masks
BLOCK = 1000  # block i uses tag BLOCK + i


def mix(seed: int, tag: int) -> int:
    return (seed * 1_000_003 + tag) % (2**62)


@contextlib.contextmanager
def seeded(seed: int, tag: int):
    """Run the body with the global CPU RNG seeded from (seed, tag); restore it afterwards."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(mix(seed, tag))
        yield


def generator(seed: int, tag: int) -> torch.Generator:
    return torch.Generator().manual_seed(mix(seed, tag))


_KEY: list[int | None] = [None]  # the running microbatch's key (`microbatch`), or None
_SAVED: list = [None]  # the generators' states as the microbatch found them, once a unit seeded them


def microbatch_key(seed: int, step: int, replica: int, mb: int) -> int:
    """The key of microbatch ``mb`` of ``step`` on data-parallel replica ``replica``."""
    return mix(mix(mix(mix(seed, DROPOUT), step), replica), mb)


@contextlib.contextmanager
def microbatch(key: int | None):
    """Run the body (a microbatch's forward, or its backward, which may re-run that forward)
    with ``key`` (`microbatch_key`) current for `seed_unit`; the generators it seeded are given
    back their states after (what draws from them outside, a batch function, sees no schedule)."""
    before = _KEY[0], _SAVED[0]
    _KEY[0], _SAVED[0] = key, None
    try:
        yield
    finally:
        if _SAVED[0] is not None:
            cpu, gpu = _SAVED[0]
            torch.default_generator.set_state(cpu)
            if gpu is not None:
                torch.cuda.set_rng_state(gpu)
        _KEY[0], _SAVED[0] = before


def seed_unit(unit: int) -> None:
    """Before unit ``unit`` (its index in the model, whatever the split) runs: seed the
    generators its random ops draw from (the CPU's, and the current GPU's) from the current
    microbatch's key; nothing outside one (a trial forward, a check)."""
    key = _KEY[0]
    if key is None:
        return
    gpu = torch.cuda.is_initialized()
    if _SAVED[0] is None:
        _SAVED[0] = (torch.default_generator.get_state(), torch.cuda.get_rng_state() if gpu else None)
    seed = mix(key, BLOCK + unit)
    torch.default_generator.manual_seed(seed)
    if gpu:
        torch.cuda.manual_seed(seed)
