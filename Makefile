# Two commands matter on a fresh clone: `make serve` (the main job) and
# `make test` (the tests; .ci/run calls it). Each sets up what it needs.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.deps-stamp
TEST_STAMP := $(VENV)/.test-deps-stamp
RECIPE ?= gemma4-moe-dflash
PYTEST_ARGS ?=

.PHONY: venv test-venv test serve dry-run patch-check lint bench clean gpu-stage gpu-proof

# The launcher alone: what `make serve` needs.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -e .
	touch $(STAMP)

# The tests also quantize for real (torch CPU 2.13.0, transformers, modelopt).
$(TEST_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e '.[test,quantize]' 'torch==2.13.0'
	touch $(TEST_STAMP)

venv: $(STAMP)

test-venv: $(TEST_STAMP)

## make test: unit + integration tests (starts dockerd when run as root and none answers)
test: test-venv
	bash tests/engines.sh
	$(BIN)/python -m pytest $(PYTEST_ARGS)

## make serve: serve the gemma4-moe-dflash recipe; without a compatible GPU it prints
## the preflight verdict and the plan, and exits non-zero with the reason.
serve: venv
	$(BIN)/launcher serve --recipe $(RECIPE) $(ARGS)

dry-run: venv
	$(BIN)/launcher serve --recipe $(RECIPE) --dry-run $(ARGS)

## make patch-check: every series against its released vLLM (wheel and sdist layouts)
patch-check: venv
	$(BIN)/launcher patch check --against vllm==0.21.0
	$(BIN)/launcher patch check --against vllm==0.33.0

bench: test-venv
	$(BIN)/python -m pytest -q -s tests/bench

## make image / make image-overlay: VLLM_VERSION=0.21.0|0.33.0|all TARGET=sm120|sm121|all
## -> vllm-sm12x:<version>-<target>-<arch>[-overlay]; overlay on BASE=<image with vLLM>
.PHONY: image image-overlay
image: venv
	PYTHON=$(BIN)/python bash docker/build-image.sh source $(or $(VLLM_VERSION),0.21.0) $(or $(TARGET),sm120)

image-overlay: venv
	PYTHON=$(BIN)/python bash docker/build-image.sh overlay $(or $(VLLM_VERSION),0.21.0) $(or $(TARGET),sm120)

## make wheels TARGET=linux-amd64|linux-arm64|wsl [VLLM_VERSION=0.21.0|0.33.0] [ARGS=--stop-before-compile]
## -> vLLM + FlashInfer wheels and a build manifest in dist/ (hours; see build/README.md)
.PHONY: wheels
wheels: venv
	$(BIN)/launcher build wheels --target $(or $(TARGET),linux-amd64) $(if $(VLLM_VERSION),--vllm-version $(VLLM_VERSION)) --output-dir dist $(ARGS)

## make build-proof TARGET=linux-amd64|linux-arm64 [VLLM_VERSION=0.21.0|0.33.0] [ARGS=--no-flashinfer]
## -> vLLM's real CMake configure + the sm_12x recipe objects compiled and checked with cuobjdump;
##    build/results/build-proof-<version>-<target>.json (about an hour on 2 cores; not part of make test)
.PHONY: build-proof
build-proof: venv
	$(BIN)/launcher build proof --target $(or $(TARGET),linux-amd64) $(if $(VLLM_VERSION),--vllm-version $(VLLM_VERSION)) $(ARGS)

## make gpu-stage: pack vLLM 0.21.0 + missing runtime wheels into .stage/ parts (<= 50 MB each)
gpu-stage: venv
	$(BIN)/python tests/gpu/stage.py

## make gpu-proof: on a GPU host (torch 2.11, Python 3.12): stage, install, run stock and
## patched rounds, write tests/gpu/results/ (tests/gpu/README.md tells the device-tool way)
gpu-proof: gpu-stage
	bash tests/gpu/remote.sh receive
	OUT=tests/gpu/results bash tests/gpu/remote.sh proof stock patched

clean:
	rm -rf $(VENV) dist .pytest_cache
