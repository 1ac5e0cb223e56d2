# Two commands matter on a fresh clone: `make serve` (the main job) and
# `make test` (the tests; .ci/run calls it). Each sets up what it needs.
# Exit codes: 0 done (a dry run that printed its plan too), 1 a check found
# problems, 2 bad input or a refusal (a serve the preflight blocks), 124 a
# wait that ran out (README.md, "Exit codes"). `make help` lists the targets.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.deps-stamp
TEST_STAMP := $(VENV)/.test-deps-stamp
RECIPE ?= gemma4-moe-dflash
# The python whose vLLM `make serve` runs. Empty: the launcher looks itself
# (its own venv has no vLLM, so: the interpreter behind `vllm` on PATH).
VLLM_PYTHON ?=
SERVE_VLLM := $(if $(VLLM_PYTHON),--vllm-python $(VLLM_PYTHON))
PYTEST_ARGS ?=
# pytest-xdist workers for `make test`: each takes whole files (a file's module fixtures are
# made once), the longest first (tests/conftest.py). Three on two cores: many tests wait on a
# subprocess, a container or a socket. TEST_WORKERS=0: one process, pytest's order.
TEST_WORKERS ?= 3
XDIST := -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

.PHONY: help venv test-venv test serve dry-run patch-check bench clean gpu-stage gpu-proof bench-gpu
# A bare `make` explains itself rather than building a venv.
.DEFAULT_GOAL := help

## make help: this list (every target, from the `## make` lines of this Makefile)
help:
	@sed -n -e 's/^## \(make \)/\1/p' -e 's/^## /    /p' $(MAKEFILE_LIST)

# The launcher alone: what `make serve` needs.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -e .
	touch $(STAMP)

# The tests also quantize for real (torch CPU 2.13.0, transformers, modelopt).
# z-lab's dflash is the drafter's oracle (tests/unit/test_drafter_conformance.py): --no-deps,
# so its own pins (datasets, requests, tqdm, transformers 5.15) stay out of this venv.
# The rule is the list of test dependencies: a venv made before it changed installs again.
$(TEST_STAMP): $(STAMP) Makefile
	$(BIN)/python -m pip install -q -e '.[test,quantize]' 'torch==2.13.0'
	$(BIN)/python -m pip install -q --no-deps dflash==0.1.0
	touch $(TEST_STAMP)

## make venv: .venv/ with the launcher alone (python -m venv + pip install -e .)
venv: $(STAMP)

## make test-venv: .venv/ with the test extras too (torch CPU, transformers, modelopt)
test-venv: $(TEST_STAMP)

## make test: unit + integration tests (starts dockerd when run as root and none answers;
## TEST_WORKERS=3 pytest-xdist workers, the longest files first: tests/conftest.py)
test: test-venv
	bash tests/engines.sh
	$(BIN)/python -m pytest $(XDIST) $(PYTEST_ARGS)

## make serve: serve the gemma4-moe-dflash recipe (RECIPE=...); where the preflight blocks
## (no compatible GPU, vLLM, patches or model) it prints the plan and exits 2 with the reason;
## ARGS="--dry-run" prints the plan and exits 0. vLLM: VLLM_PYTHON=/path/to/python, else the
## launcher's own .venv when it has one (launcher install), else the `vllm` first on PATH.
serve: venv
	$(BIN)/launcher serve --recipe $(RECIPE) $(SERVE_VLLM) $(ARGS)

## make dry-run: make serve ARGS=--dry-run (the plan and preflight; starts nothing; exits 0)
dry-run: venv
	$(BIN)/launcher serve --recipe $(RECIPE) $(SERVE_VLLM) --dry-run $(ARGS)

## make patch-check: every series (patches/vllm/*/series) against its released vLLM (wheel and sdist)
patch-check: venv
	@set -e; for series in patches/vllm/*/series; do \
		$(BIN)/launcher patch check --against vllm==$$(basename $$(dirname $$series)); \
	done

## make drift-watch: the newest vLLM on PyPI (and NGC_TAGS=<tag list file>) against the series
.PHONY: drift-watch
drift-watch: venv
	$(BIN)/launcher patch drift $(if $(NGC_TAGS),--ngc-tags $(NGC_TAGS))

## make bench: the benchmark tests (tests/bench), printing their numbers
bench: test-venv
	$(BIN)/python -m pytest -q -s tests/bench

## make image / make image-overlay: VLLM_VERSION=0.21.0|0.33.0|all TARGET=sm120|sm121|all
## -> vllm-sm12x:<version>-<target>-<arch>[-overlay]; overlay on BASE=<image with vLLM>
##    (e.g. BASE=nvcr.io/nvidia/vllm:26.09-py3 TARGET=sm121 -> vllm-sm12x:0.29.0-ngc26.09-sm121-arm64-overlay)
.PHONY: image image-overlay
image: venv
	PYTHON=$(BIN)/python bash docker/build-image.sh source $(or $(VLLM_VERSION),0.21.0) $(or $(TARGET),sm120)

image-overlay: venv
	BASE=$(BASE) PYTHON=$(BIN)/python bash docker/build-image.sh overlay $(or $(VLLM_VERSION),$(if $(BASE),auto,0.33.0)) $(or $(TARGET),sm120)

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
## patched rounds, write tests/gpu/results/ (tests/gpu/README.md: a host without network too)
gpu-proof: gpu-stage
	bash tests/gpu/remote.sh receive
	OUT=tests/gpu/results bash tests/gpu/remote.sh proof stock patched

## make gpu-realshape: the real-shape proof (issue 11) on a GPU host with this checkout:
## stage the bundle, FA2 and the modelopt wheels, then on the GPU: the bf16-stability search
## (picks the norm scale), `launcher quantize` of the NVFP4 target, every run of realshape.py
## (RUNS=a,b narrows; tests/gpu/README.md, "Commands"); results in tests/gpu/results/realshape.*
.PHONY: gpu-realshape-stage gpu-realshape
## make gpu-realshape-stage: make gpu-stage, plus the FA2 and modelopt extras the real-shape runs install
gpu-realshape-stage: gpu-stage
	$(BIN)/python tests/gpu/stage.py --extras --extras-name extras-fa2
	$(BIN)/python tests/gpu/stage.py --extras --extras-name extras-quant --no-fa2 --quant-wheels

gpu-realshape: gpu-realshape-stage
	bash tests/gpu/remote.sh receive
	OUT=tests/gpu/results bash tests/gpu/remote.sh stability
	bash tests/gpu/remote.sh quantize-rs
	OUT=tests/gpu/results bash tests/gpu/remote.sh realshape

## make gpu-realshape-v33: the real-shape proof on vLLM 0.33.0 (issue 12) on a GPU host with
## torch 2.11: stage 0.33.0 (+ FA2) beside the 0.21.0 bundle, then every v33-* run of realshape.py
## (RUNS=a,b narrows; tests/gpu/README.md, "Commands")
.PHONY: gpu-realshape-v33
gpu-realshape-v33: gpu-realshape-stage
	$(BIN)/python tests/gpu/stage.py --vllm 0.33.0 --with-fa2
	bash tests/gpu/remote.sh receive
	RS_POST_NORM=$${RS_POST_NORM:-0.15} bash tests/gpu/remote.sh quantize-rs
	RS_POST_NORM=$${RS_POST_NORM:-0.15} OUT=tests/gpu/results bash tests/gpu/remote.sh realshape-v33

## make gpu-trained: the trained-target proof (issue 23) on a GPU host (an H200: the drafter's recipe
## holds 85 GB): stage, then on the GPU train the target (train_target.py, ~5 min, seeded) and its
## DFlash drafter (train_drafter.py, ~20 min, seeded), quantize the target with `launcher quantize`,
## and run every trained-* run of realshape.py (RUNS=a,b narrows; RS_PARALLEL="a,b;c,d" runs lanes side by
## side); results in tests/gpu/results/realshape.* and trained/ (tests/gpu/README.md, "Commands")
.PHONY: gpu-trained
gpu-trained: gpu-realshape-stage
	bash tests/gpu/remote.sh receive
	OUT=tests/gpu/results/trained bash tests/gpu/remote.sh train-target
	OUT=tests/gpu/results/trained bash tests/gpu/remote.sh train-drafter
	OUT=tests/gpu/results bash tests/gpu/remote.sh realshape-trained

## make gpu-served: issue 26 on a GPU host (one H100 or H200): stage the bundle and FA2, train the
## target, then every served phase in one go (tests/gpu/README.md, "Commands")
.PHONY: gpu-served
gpu-served: gpu-stage
	$(BIN)/python tests/gpu/stage.py --extras --extras-name extras-fa2
	bash tests/gpu/remote.sh receive
	OUT=tests/gpu/results/trained bash tests/gpu/remote.sh train-target
	SERVED_DEADLINE_S=$${SERVED_DEADLINE_S:-3600} OUT=tests/gpu/results bash tests/gpu/remote.sh served

## make bench-gpu: on a GPU host (torch 2.11, Python 3.12): stage, install, run the step-time
## benchmark at Gemma 4 26B-A4B widths, write tests/gpu/results/bench.{json,md} (tests/gpu/README.md)
bench-gpu: gpu-stage
	bash tests/gpu/remote.sh receive
	OUT=tests/gpu/results bash tests/gpu/remote.sh bench

## make clean: remove .venv/, dist/ and pytest's cache
clean:
	rm -rf $(VENV) dist .pytest_cache
