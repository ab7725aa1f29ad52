"""The plan's command that measures its best, the candidates close to it and the run it read
beside one another (ppx.plan.paired_command): one run.paired entry each, at the run's p and m,
the run's own config the floor, checked as ppx run would check it."""

from __future__ import annotations

from ppx import config
from ppx.plan.paired_command import entry_of, paired_command

EXP = "llama_tiny_1f1b_2cpu"  # p=2, m=4, 1F1B


def _cmd(*overrides: str) -> str:
    return " ".join(["ppx run", EXP, *overrides, "run.dir=null", "run.paired=[]"])


def test_a_candidates_command_becomes_an_entry_of_its_pipeline_model_and_train_keys():
    text = _cmd("pipeline.schedule=zb_h2", "pipeline.stages=2", "pipeline.microbatches=4", "train.split_backward=auto")
    assert entry_of(text) == "pipeline.schedule=zb_h2 train.split_backward=auto"


def test_the_best_and_the_close_ones_at_the_runs_p_and_m_beside_the_run_as_its_floor():
    run = config.load(EXP, [])
    chosen = [
        (2, 4, _cmd("pipeline.schedule=zb_h1", "pipeline.stages=2", "pipeline.microbatches=4")),
        (2, 4, _cmd("pipeline.schedule=interleaved_1f1b", "pipeline.virtual_stages=2", "pipeline.stages=2")),
        (4, 4, _cmd("pipeline.schedule=gpipe", "pipeline.stages=4")),  # other processes: no entry
        (2, 8, _cmd("pipeline.schedule=gpipe", "pipeline.microbatches=8", "train.batch_size=32")),  # another m
    ]
    got = paired_command(chosen, run, EXP)
    assert got == (
        f"ppx sweep {EXP} --repeat 5 'run.paired=[pipeline.schedule=1f1b,pipeline.schedule=zb_h1,"
        '"pipeline.schedule=interleaved_1f1b pipeline.virtual_stages=2"]\''
    )
    # the best is the run's own config: it is the floor, and the close one is held against it
    own = [(2, 4, _cmd("pipeline.schedule=1f1b", "pipeline.microbatches=4")), chosen[0]]
    assert paired_command(own, run, EXP).endswith("'run.paired=[pipeline.schedule=1f1b,pipeline.schedule=zb_h1]'")
    assert paired_command(own[:1], run, EXP) is None  # the run alone: nothing to measure
    # an entry that cannot be one (a key fixed for the job) gives no command, not one that fails
    assert paired_command([(2, 4, _cmd("pipeline.schedule=zb_h1", "train.steps=3"))], run, EXP) is None
