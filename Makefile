# croqq: `make` lists the targets. Everything runs inside .venv (created on first use).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)

.DEFAULT_GOAL := help
.PHONY: help install demo test test-fast lint bench kernels gpu-check clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[flower]' --group dev
	rm -f $(VENV)/.installed-*
	touch $@

install: $(STAMP)  ## create .venv and install croqq with its dev tools

demo: $(STAMP)  ## a whole local cluster tunes all 268 shapes (simulated GPUs, the scripted agent); Ctrl-C stops, re-run resumes
	CROQQ_RUN_DIR=.demo CROQQ_RESULTS_REPO=.demo/results CROQQ_PROPOSER=agent CROQQ_AGENT=scripted \
	  $(BIN)/croqq up --dtype all --exit-when-done

test: $(STAMP)  ## the whole test suite (unit, integration, chaos) on real Redis, Celery and git
	$(BIN)/python -m pytest

test-fast: $(STAMP)  ## the tests that need no cluster processes
	$(BIN)/python -m pytest -m "not slow and not chaos"

lint: $(STAMP)  ## ruff (lint + format check) and mypy
	$(BIN)/ruff check croqq benchmarks tests
	$(BIN)/ruff format --check croqq benchmarks tests
	$(BIN)/mypy

bench: $(STAMP)  ## every benchmark -> bench/results.json, plus one line in benchmarks/history.jsonl
	$(BIN)/python -m benchmarks --out bench/results.json

kernels: $(STAMP)  ## compile every kernel of every family in kernels/manifest.json (reference knobs, sm_90a) into build/kernels
	$(BIN)/croqq kernels --out build/kernels

gpu-check: $(STAMP)  ## on an NVIDIA GPU host, `croqq gpu-check`: build, verify, time vs cuBLAS, a real tuning loop
	$(BIN)/croqq gpu-check --out bench/gpu_check.json

clean:  ## remove the venv, demo state and caches
	rm -rf $(VENV) .demo .croqq .pytest_cache .mypy_cache .ruff_cache
