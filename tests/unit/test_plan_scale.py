"""`ppx.plan.scale`: a plan says it is a prediction for a cluster when its p fits neither this
machine's GPUs nor a handful of CPU ranks."""

from __future__ import annotations

from ppx.plan.scale import CPU_RANKS, cluster_note


def test_small_plans_run_here():
    assert cluster_note(CPU_RANKS, gpus=0) is None
    assert cluster_note(16, gpus=16) is None


def test_large_plans_are_for_a_cluster():
    note = cluster_note(64, gpus=8)
    assert note.startswith("note: these are predictions for a cluster (up to 64 ranks), not runnable on this machine")
    assert "8 GPU(s)" in note
    assert "no GPU" in cluster_note(CPU_RANKS + 1, gpus=0)
