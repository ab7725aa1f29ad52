"""CPU blocks per rank (ppx.launch.affinity)."""

from ppx.launch.affinity import cpu_block, describe


def test_cpu_blocks_split_the_cpus_and_share_them_round_robin():

    assert [cpu_block(r, 2, [0, 1]) for r in range(2)] == [[0], [1]]
    assert [cpu_block(r, 4, [0, 1]) for r in range(4)] == [[0], [1], [0], [1]]  # neighbours apart
    assert [cpu_block(r, 5, [0, 1]) for r in range(5)] == [[0], [1], [0], [1], [0]]
    assert [cpu_block(r, 3, [4, 5, 6, 7, 8, 9, 10, 11]) for r in range(3)] == [[4, 5], [6, 7, 8], [9, 10, 11]]
    blocks = [cpu_block(r, 5, range(16)) for r in range(5)]
    assert sorted(c for b in blocks for c in b) == list(range(16))  # every CPU used once
    assert describe([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"
