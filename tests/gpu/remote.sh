#!/usr/bin/env bash
# The on-device half of the GPU proof (tests/gpu/README.md). Runs from the
# repository root on a machine with an NVIDIA GPU, Python 3.12 and torch
# 2.11 (vLLM 0.21.0's pin), without network.
#
#   remote.sh receive          copy the bundle parts present in .stage/ to $BUNDLE_DIR
#   remote.sh install          reassemble, verify and install the bundle into $SITE (once)
#   remote.sh proof [ROUND..]  install, make the checkpoints, run ROUNDs (stock, patched;
#                              default both), compare, write results under $OUT
#
# Files in /tmp survive between calls on a warm device machine, so the parts
# can arrive one call at a time and each round can run in its own call.
set -euo pipefail

BUNDLE_DIR=${BUNDLE_DIR:-/tmp/vllm-bundle}
SITE=${SITE:-/tmp/site}
SITE_PATCHED=${SITE_PATCHED:-/tmp/site-patched}
MODELS=${MODELS:-/tmp/models}
WORK=${WORK:-/tmp/gpu-proof}
OUT=${OUT:-$WORK/out}
PY=${PY:-python3}
STAGE=.stage

export VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
# Keep NVLink multicast off, as the device machines require.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

manifest_field() { # manifest_field PYEXPR: evaluate with m = the bundle manifest
    "$PY" -c "import json,sys; m=json.load(open(sys.argv[1])); print($1)" "$BUNDLE_DIR/bundle.json"
}

receive() {
    mkdir -p "$BUNDLE_DIR"
    [ -f "$STAGE/bundle.json" ] && cp "$STAGE/bundle.json" "$BUNDLE_DIR/bundle.json"
    [ -f "$BUNDLE_DIR/bundle.json" ] || { echo "no $STAGE/bundle.json carried yet" >&2; return 1; }
    local part
    for part in "$STAGE"/bundle.tar.xz.part*; do
        [ -f "$part" ] || continue
        cp "$part" "$BUNDLE_DIR/"
    done
    "$PY" - "$BUNDLE_DIR" <<'EOF'
import hashlib, json, sys
from pathlib import Path
d = Path(sys.argv[1]); m = json.loads((d / "bundle.json").read_text())
have = []
for p in m["parts"]:
    f = d / p["name"]
    if f.exists() and hashlib.sha256(f.read_bytes()).hexdigest() == p["sha256"]:
        have.append(p["name"])
    elif f.exists():
        f.unlink(); print(f"bad checksum, dropped: {p['name']}")
print(f"bundle parts held: {len(have)}/{len(m['parts'])} {have}")
EOF
}

install() {
    if [ -f "$SITE/.bundle-installed" ]; then
        echo "bundle already installed in $SITE"; return 0
    fi
    local n whole
    n=$(manifest_field 'len(m["parts"])')
    whole=$(manifest_field 'm["sha256"]')
    local parts=()
    for i in $(seq 0 $((n - 1))); do
        parts+=("$BUNDLE_DIR/$(printf 'bundle.tar.xz.part%02d' "$i")")
    done
    for p in "${parts[@]}"; do
        [ -f "$p" ] || { echo "missing bundle part $p: carry it first (receive)" >&2; return 1; }
    done
    echo "$whole  -" > "$BUNDLE_DIR/whole.sha256"
    cat "${parts[@]}" | sha256sum -c "$BUNDLE_DIR/whole.sha256" >/dev/null
    rm -rf "$WORK/bundle" && mkdir -p "$WORK/bundle" "$SITE"
    cat "${parts[@]}" | xz -d | tar -x -C "$WORK/bundle"
    # Exact pins from the requirements file: a stale wheel in the bundle is ignored.
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" --find-links "$WORK/bundle/wheels" -r tests/gpu/bundle-requirements.txt
    cp -a "$WORK/bundle/site/." "$SITE/"
    rm -rf "$WORK/bundle"
    touch "$SITE/.bundle-installed"
    PYTHONPATH=$SITE "$PY" -c 'import vllm, transformers, torch; print("vllm", vllm.__version__, "transformers", transformers.__version__, "torch", torch.__version__)'
}

patched_site() {
    rm -rf "$SITE_PATCHED" && mkdir -p "$SITE_PATCHED"
    cp -a "$SITE/vllm" "$SITE"/vllm-*.dist-info "$SITE_PATCHED/"
    PYTHONPATH=.:$SITE "$PY" - "$SITE_PATCHED" <<'EOF'
import sys
from launcher.patching.engine import apply
r = apply(sys.argv[1])
print(r.message)
print("series hash", r.series_hash)
for p in r.results:
    print(" ", p.outcome, p.name)
EOF
}

series_hash() {
    PYTHONPATH=.:$SITE "$PY" -c 'from launcher.patching.engine import status; s = status(__import__("sys").argv[1]); print(s.series_hash)' "$SITE_PATCHED" 2>/dev/null || true
}

proof() {
    local rounds=("$@")
    [ ${#rounds[@]} -gt 0 ] || rounds=(stock patched)
    install
    mkdir -p "$OUT" "$WORK"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$WORK/gpu.txt"
    if ! grep -q t12-unscaled "$MODELS/shapes.json" 2>/dev/null; then
        PYTHONPATH=$SITE "$PY" tests/gpu/make_checkpoints.py "$MODELS" 2>&1 | grep -v "Writing model shards" || true
        [ -f "$MODELS/shapes.json" ] || { echo "checkpoint generation failed" >&2; return 1; }
    fi
    local r site
    # MODES / DRAFTERS (comma-separated) narrow a round; ROUND_SUFFIX (e.g.
    # -diag) labels it apart from the standard rounds.
    local extra=() suffix=${ROUND_SUFFIX:-}
    [ -n "${MODES:-}" ] && extra+=(--modes "$MODES")
    [ -n "${DRAFTERS:-}" ] && extra+=(--drafters "$DRAFTERS")
    for r in "${rounds[@]}"; do
        case "$r" in
            stock) site=$SITE ;;
            patched) patched_site | tee "$WORK/patch-apply.txt"; site=$SITE_PATCHED:$SITE ;;
            *) echo "unknown round $r (stock|patched)" >&2; return 2 ;;
        esac
        "$PY" tests/gpu/run_modes.py --models "$MODELS" --site "$site" --label "$r$suffix" \
            --out "$WORK/$r$suffix.json" --logs "$WORK/logs-$r$suffix" \
            --deadline-s "${ROUND_DEADLINE_S:-540}" "${extra[@]}"
        # Each finished round goes to $OUT at once, so a call cut short keeps it.
        cp "$WORK/$r$suffix.json" "$OUT/" 2>/dev/null || true
    done
    local have=()
    for r in stock patched stock-diag patched-diag; do
        [ -f "$WORK/$r.json" ] && have+=("$WORK/$r.json")
    done
    local hash=""
    [ -d "$SITE_PATCHED/vllm" ] && hash=$(series_hash)
    PYTHONPATH=$SITE "$PY" - "$WORK/meta.json" "$WORK/gpu.txt" "$hash" <<'EOF'
import datetime, json, sys
import torch, vllm
meta = {
    "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    "gpu": open(sys.argv[2]).read().strip(),
    "vllm": vllm.__version__,
    "torch": torch.__version__,
    "series": ("patches/vllm/0.21.0 sha256 " + sys.argv[3]) if sys.argv[3] else None,
    "command": "bash tests/gpu/remote.sh proof (see tests/gpu/README.md)",
}
json.dump(meta, open(sys.argv[1], "w"), indent=1)
EOF
    "$PY" tests/gpu/compare.py "${have[@]}" --meta "$WORK/meta.json" \
        --json "$OUT/results.json" --md "$OUT/results.md"
    local logs=()
    for r in "$WORK"/logs-* "$WORK"/patch-apply.txt; do [ -e "$r" ] && logs+=("$(basename "$r")"); done
    tar -C "$WORK" -czf "$OUT/logs.tar.gz" "${logs[@]}"
}

bench_run() { # the step-time benchmark (tests/gpu/bench_steps.py); results under $OUT
    local t0=$SECONDS budget=${BENCH_BUDGET_S:-525}
    install
    mkdir -p "$OUT" "$WORK/bench"
    patched_site > "$WORK/bench/patch-apply.txt"
    [ -f "$SITE/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so" ] \
        || echo "warning: no _vllm_fa2_C.abi3.so in $SITE: the FA2 runs will fail" >&2
    if [ ! -f "$MODELS/bench/bench-shapes.json" ]; then
        PYTHONPATH=$SITE "$PY" tests/gpu/make_bench_checkpoints.py "$MODELS/bench"
    fi
    local extra=()
    [ -n "${BENCH_RUNS:-}" ] && extra+=(--runs "$BENCH_RUNS")
    "$PY" tests/gpu/bench_steps.py --models "$MODELS/bench" --site "$SITE_PATCHED:$SITE" \
        --out "$WORK/bench" --deadline-s $((budget - (SECONDS - t0))) --series-hash "$(series_hash)" "${extra[@]}" \
        || echo "bench_steps.py exited $?" >&2
    cp "$WORK/bench/bench.json" "$WORK/bench/bench.md" "$OUT/" 2>/dev/null || true
    cp "$WORK"/bench/run-*.json "$OUT/" 2>/dev/null || true
    tar -C "$WORK/bench" -czf "$OUT/bench-logs.tar.gz" logs patch-apply.txt
}

cmd=${1:-}
shift || true
case "$cmd" in
    receive) receive ;;
    install) install ;;
    proof) proof "$@" ;;
    bench) bench_run ;;
    *) echo "usage: $0 receive|install|proof [stock] [patched]" >&2; exit 2 ;;
esac
