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
	$(BIN)/python tests/gpu/staging/stage.py

## make gpu-proof: on a GPU host (torch 2.11, Python 3.12): stage, install, run stock and
## patched rounds, write tests/gpu/results/ (tests/gpu/README.md: a host without network too)
gpu-proof: gpu-stage
	bash tests/gpu/remote.sh receive
	OUT=tests/gpu/results bash tests/gpu/remote.sh proof stock patched

## make gpu-evidence: every results page below, each by its fixed step list (tests/gpu/reports/evidence.py):
## staging, training (or restoring the checkpoints staged as parts), the runs, every merge, the report.
## On a GPU host with network and this checkout; a host without network runs the same steps split:
## WHERE=network on a machine with network, the .stage/ parts copied over, then WHERE=gpu,cpu
## on the GPU host (tests/gpu/README.md, "A GPU host without network"). `python tests/gpu/reports/evidence.py
## plan PAGE` prints a page's steps.
.PHONY: gpu-evidence gpu-realshape gpu-acceptance gpu-served gpu-speed gpu-fullsize gpu-conformance gpu-speedup gpu-multinode
# WHERE without "network" (the GPU host of an air-gapped pair): no venv, whose pip needs the
# network; remote.sh's evidence verb runs the steps on the host's Python instead.
EVIDENCE_OFFLINE := $(if $(WHERE),$(if $(findstring network,$(WHERE)),,yes))
EVIDENCE := $(if $(EVIDENCE_OFFLINE),bash tests/gpu/remote.sh evidence,$(BIN)/python tests/gpu/reports/evidence.py run) \
	$(if $(WHERE),--where $(WHERE))
EVIDENCE_VENV := $(if $(EVIDENCE_OFFLINE),,venv)
gpu-evidence: $(EVIDENCE_VENV)
	$(EVIDENCE) all

## make gpu-realshape: results/realshape.md (random-target rounds of 0.21.0 and 0.33.0, trained-target rows)
gpu-realshape: $(EVIDENCE_VENV)
	$(EVIDENCE) realshape

## make gpu-acceptance: results/acceptance.md (the drafter's rows as lanes, the NVFP4 walks; speed columns from served.json)
gpu-acceptance: $(EVIDENCE_VENV)
	$(EVIDENCE) acceptance

## make gpu-served: results/served.md (`launcher serve` servers of both releases and recipes)
gpu-served: $(EVIDENCE_VENV)
	$(EVIDENCE) served

## make gpu-speed: results/served.md's speed rows (the speed pair of both releases, gated prompts)
gpu-speed: $(EVIDENCE_VENV)
	$(EVIDENCE) speed

## make gpu-fullsize: results/fullsize.md (full-size checkpoints, bench, the rtx5090 and dgx-spark fit)
gpu-fullsize: $(EVIDENCE_VENV)
	$(EVIDENCE) fullsize

## make gpu-conformance: results/conformance.md (a gated target and its drafter, z-lab's loop, served vLLM)
gpu-conformance: $(EVIDENCE_VENV)
	$(EVIDENCE) conformance

## make gpu-speedup: results/speedup-curve.md (the frozen step-time model, then the speed-up curve's batches)
gpu-speedup: $(EVIDENCE_VENV)
	$(EVIDENCE) speedup

## make gpu-multinode: results/multinode.md (a host with two GPUs: two `launcher serve` nodes, TP 2 across them)
gpu-multinode: $(EVIDENCE_VENV)
	$(EVIDENCE) multinode

## make bench-gpu: on a GPU host (torch 2.11, Python 3.12): stage, install, run the step-time
## benchmark at Gemma 4 26B-A4B widths, write tests/gpu/results/bench.{json,md} (tests/gpu/README.md)
bench-gpu: gpu-stage
	bash tests/gpu/remote.sh receive
	OUT=tests/gpu/results bash tests/gpu/remote.sh bench

## make clean: remove .venv/, dist/ and pytest's cache
clean:
	rm -rf $(VENV) dist .pytest_cache
