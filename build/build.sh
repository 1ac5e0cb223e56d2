#!/usr/bin/env bash
# Build vLLM (and FlashInfer) wheels for sm_120 / sm_121 on Linux or WSL2.
#
# Thin on purpose: it prepares a venv holding this launcher, then runs
# `launcher build <command> ...`; the plan, preflight and build live in
# launcher/builder/. The same venv receives torch for the build.
#
#   build/build.sh --target linux-amd64                  # RTX 5090 (x86_64)
#   build/build.sh --target linux-arm64                  # DGX Spark (on the Spark)
#   build/build.sh --target wsl --stop-before-compile    # patched tree + commands only
#   build/build.sh plan --target linux-arm64             # any launcher build subcommand
#
# Environment: PYTHON (interpreter for the venv, default python3),
# BUILD_VENV (default ~/.cache/vllm-sm12x/build-venv).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-python3}"
venv="${BUILD_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/vllm-sm12x/build-venv}"

command="wheels"
case "${1:-}" in
  plan | preflight | wheels | targets)
    command="$1"
    shift
    ;;
esac

if [ ! -x "$venv/bin/python" ]; then
  echo "build.sh: creating $venv" >&2
  "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet "$repo"

exec "$venv/bin/launcher" build "$command" "$@"
