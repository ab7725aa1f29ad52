# ppx: `make run EXP=<experiment> ARGS="key=value ..."` and `make test` set up .venv themselves.
PYTHON ?= python3
VENV ?= .venv
# The torch to install when .venv has none (override for a specific CUDA build).
TORCH_SPEC ?= torch==2.13.0
EXP ?= gpipe_4gpu
ARGS ?=
PYTEST_ARGS ?=

PY := $(VENV)/bin/python
STAMP := $(VENV)/.ppx-installed

.PHONY: setup run test schedule keys clean-runs bench

$(STAMP): pyproject.toml Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install "$(TORCH_SPEC)"
	$(PY) -m pip install -e ".[test]"
	@touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/ppx run $(EXP) $(ARGS)

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

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
