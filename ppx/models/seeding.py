"""Deterministic initialisation: every block is built under its own seed, so the weights of
block i are the same whatever the stage count or split."""

from __future__ import annotations

import contextlib

import torch

EMBEDDING, HEAD, TEACHER, DATA = 1, 2, 3, 4  # tags for the non-block parts
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
