"""CPU blocks per rank (ppx.launch.affinity)."""

from ppx.launch.affinity import cpu_block, describe, pin_order


def test_cpu_blocks_split_the_cpus_and_share_them_round_robin():

    assert [cpu_block(r, 2, [0, 1]) for r in range(2)] == [[0], [1]]
    assert [cpu_block(r, 4, [0, 1]) for r in range(4)] == [[0], [1], [0], [1]]  # neighbours apart
    assert [cpu_block(r, 5, [0, 1]) for r in range(5)] == [[0], [1], [0], [1], [0]]
    assert [cpu_block(r, 3, [4, 5, 6, 7, 8, 9, 10, 11]) for r in range(3)] == [[4, 5], [6, 7, 8], [9, 10, 11]]
    blocks = [cpu_block(r, 5, range(16)) for r in range(5)]
    assert sorted(c for b in blocks for c in b) == list(range(16))  # every CPU used once
    assert describe([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"


def test_data_parallel_keeps_a_replicas_pipeline_neighbours_on_two_cpus():
    """pp=2 x dp=2 on 2 CPUs: ranks 0 and 2 are replica 0's stages 0 and 1, 1 and 3 replica 1's
    (pipeline rank x d + replica); by local rank alone 0 and 2 shared CPU 0."""
    cpus = {r: cpu_block(pin_order(r, 4, r, 4, 2), 4, [0, 1]) for r in range(4)}
    assert cpus[0] != cpus[2] and cpus[1] != cpus[3]
    assert [pin_order(r, 6, r, 6, 2) for r in range(6)] == [0, 3, 1, 4, 2, 5]  # p=3 x d=2, replica by replica
    assert [pin_order(r, 4, r, 4, 1) for r in range(4)] == [0, 1, 2, 3]
    # a node holding part of the job (global ranks 4-7 of 8, d=2): its own ranks, replica by replica
    assert [pin_order(g, 8, g - 4, 4, 2) for g in range(4, 8)] == [0, 2, 1, 3]
