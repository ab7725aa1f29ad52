# ppx: `make run EXP=<experiment> ARGS="key=value ..."` and `make test` set up .venv themselves.
PYTHON ?= python3
VENV ?= .venv
# The torch to install when .venv has none (override for a specific CUDA build), and the index
# to take it from (empty: PyPI; https://download.pytorch.org/whl/cpu: the CPU build, for a machine
# without a GPU, a few hundred MB where PyPI's Linux wheel brings GBs of CUDA libraries).
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=
EXP ?= gpipe_4gpu
ARGS ?=
PYTEST_ARGS ?=
TEST_WORKERS ?= 2

PY := $(VENV)/bin/python
STAMP := $(VENV)/.ppx-installed

.PHONY: setup run test lint format schedule keys clean-runs bench gpu-check sweep compare tb sbatch

$(STAMP): pyproject.toml Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install "$(TORCH_SPEC)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PY) -m pip install -e ".[test,hf]"
	@touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/ppx run $(EXP) $(ARGS)

# two test files at a time (pytest-xdist; TEST_WORKERS=0: one process), then the tests marked
# `timing` one at a time in one process (tests/helpers/machine.py): each runs alone, and none
# waits in the middle of the others for the running ones to finish. Both parts run; the exit
# status is the first failing one's (a part that selects no test passes, unless both select none)
test: $(STAMP)
	@shared=0; timed=0; \
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile -m "not timing" $(PYTEST_ARGS) || shared=$$?; \
	$(PY) -m pytest -p no:xdist -m timing $(PYTEST_ARGS) || timed=$$?; \
	for s in $$shared $$timed; do case $$s in 0|5) ;; *) exit $$s ;; esac; done; \
	[ $$shared$$timed != 55 ] || exit 5

# ruff: lint and formatting, as CI checks them (make format rewrites the files)
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# make schedule NAME=1f1b P=4 M=8
schedule: $(STAMP)
	$(VENV)/bin/ppx schedule $(or $(NAME),1f1b) --stages $(or $(P),4) --microbatches $(or $(M),8)

keys: $(STAMP)
	$(VENV)/bin/ppx keys

clean-runs:
	rm -rf runs

# The benchmark matrix: ppx vs torch.distributed.pipelining, known-cost vs ideal, overheads.
bench: $(STAMP)
	$(PY) bench/run.py

# Every CUDA path checked on this machine's GPUs, under 10 minutes on one H100: gpu-checks/<time>/gpu-check.md,
# and the table in docs/benchmarks.md ("On a GPU"). Without CUDA: one line, nothing to check. ARGS="--only timers,nccl"
gpu-check: $(STAMP)
	$(VENV)/bin/ppx gpu-check --docs docs/benchmarks.md $(ARGS)

# make sweep EXP=gpipe_4gpu SWEEP="pipeline.schedule=naive,gpipe,1f1b pipeline.microbatches=1,2,4,8,16"
sweep: $(STAMP)
	$(VENV)/bin/ppx sweep $(EXP) --sweep "$(SWEEP)" $(if $(LAUNCHER),--launcher $(LAUNCHER)) $(ARGS)

# make compare RUNS="runs/gpipe_4gpu/* runs/1f1b_4gpu/*"
compare: $(STAMP)
	$(VENV)/bin/ppx compare $(RUNS)

# TensorBoard over every run and comparison. Offline: the Scalars, Images (timeline, breakdown,
# compare, bubble) and Text (summary, config) tabs. The PyTorch Profiler tab (one worker per rank)
# needs internet access in the browser: torch-tb-profiler loads Google Charts from gstatic.com.
# Offline alternatives: those tabs, each run's (and comparison's) self-contained report.html,
# the PNGs in each run directory, and timeline.json or the traces in Perfetto (ui.perfetto.dev,
# loaded once while online).
tb: $(STAMP)
	@echo "ppx: Scalars, Images and Text work offline; the PyTorch Profiler tab needs internet access in the browser (it loads Google Charts)."
	@echo "ppx: offline instead: each run's report.html (one file, opens in any browser), its timeline.png / breakdown.png, and timeline.json in Perfetto (ui.perfetto.dev, once online)."
	$(VENV)/bin/tensorboard --logdir $(or $(LOGDIR),runs) --load_fast=false --port $(or $(PORT),6006)

# Submit an experiment to SLURM: make sbatch EXP=gpipe_4gpu NODES=2 ARGS="..."
sbatch:
	@mkdir -p runs
	EXP=$(EXP) ARGS="$(ARGS)" sbatch --nodes $(or $(NODES),1) --output=runs/slurm-%j.out $(SBATCH_ARGS) slurm/pp.sbatch
