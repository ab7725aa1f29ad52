"""ppx's torchrun without the rendezvous' fixed costs (`ppx.launch.lean_rendezvous`): the names
torch's events record are the ones its own `get_method_name` reads, and the random wait of a
node's first join is dropped for a job of one node only."""

from __future__ import annotations

import pytest
from torch.distributed.elastic.rendezvous import dynamic_rendezvous

from ppx.launch import lean_rendezvous

ORIGINAL = dynamic_rendezvous.get_method_name
assert ORIGINAL.__module__ == dynamic_rendezvous.__name__, "torch's own, not one patched before this module"
WORKER = ["--run-path", "--start-method=fork", "/x/forked_worker.py", "/runs/r"]


def _named(get, depth):
    def record():  # as torch's `_record`: the name of the method that called it
        return get(depth)

    def next_rendezvous():
        return record()

    return next_rendezvous()


@pytest.mark.parametrize("depth", [1, 2, 3, 4])  # (0: the function itself, by its own name)
def test_the_method_name_is_torchs(depth):
    assert lean_rendezvous._method_name(depth) == ORIGINAL(depth)
    assert _named(lean_rendezvous._method_name, depth) == _named(ORIGINAL, depth)
    assert _named(lean_rendezvous._method_name, 2) == "next_rendezvous"


def test_a_stack_less_deep_than_asked_is_named_as_torch_names_it():
    assert lean_rendezvous._method_name(10_000) == ORIGINAL(10_000) == "no_method_name"


@pytest.mark.parametrize(
    "argv, one",
    [
        (["--standalone", "--nnodes=1", "--nproc-per-node=4", *WORKER], True),
        (["--nnodes=1", "--nproc-per-node=2", *WORKER], True),
        (["--nproc-per-node=2", *WORKER], True),  # (torchrun's default: 1:1)
        (["--nnodes=1:1", "--nproc-per-node=2", *WORKER], True),
        (["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:29500", *WORKER], False),
        (["--nnodes=1:2", "--nproc-per-node=2", *WORKER], False),
        (["--nnodes=2", "-m", "ppx.launch.worker", "--nnodes=1"], False),  # (the worker's own arguments)
        (["--no-such-flag"], False),
    ],
)
def test_one_node_is_read_as_torchrun_reads_it(argv, one, capsys):
    assert lean_rendezvous._one_node(argv) is one
    assert capsys.readouterr().err == ""  # (arguments torchrun refuses: its own message says why)


def test_one_nodes_first_join_does_not_wait_and_every_other_delay_stays(monkeypatch):
    waits = []
    monkeypatch.setattr(dynamic_rendezvous, "_delay", waits.append)
    monkeypatch.setattr(dynamic_rendezvous, "get_method_name", ORIGINAL)
    lean_rendezvous.apply(["--standalone", "--nproc-per-node=2", *WORKER])
    assert dynamic_rendezvous.get_method_name is lean_rendezvous._method_name
    dynamic_rendezvous._delay((0, 0.3))
    dynamic_rendezvous._delay(1)
    assert waits == [1]  # (the poll between syncs is torch's)


def test_several_nodes_keep_the_first_joins_wait(monkeypatch):
    waits = []
    monkeypatch.setattr(dynamic_rendezvous, "_delay", waits.append)
    monkeypatch.setattr(dynamic_rendezvous, "get_method_name", ORIGINAL)
    lean_rendezvous.apply(["--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=h:29500", *WORKER])
    dynamic_rendezvous._delay((0, 0.3))
    assert waits == [(0, 0.3)]
    assert dynamic_rendezvous.get_method_name is lean_rendezvous._method_name
