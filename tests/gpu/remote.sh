#!/usr/bin/env bash
# The on-device half of the GPU proof (tests/gpu/README.md). Runs from the
# repository root on a machine with an NVIDIA GPU, Python 3.12 and torch
# 2.11 (vLLM 0.21.0's pin), without network.
#
#   remote.sh receive          copy the bundle parts present in .stage/ to $BUNDLE_DIR
#   remote.sh install          reassemble, verify and install the bundle into $SITE (once)
#   remote.sh proof [ROUND..]  install, make the checkpoints, run ROUNDs (stock, patched;
#                              default both), compare, write results under $OUT
#   remote.sh full-size-checkpoints | fit | full-bench   issue 27 (tests/gpu/README.md, "Commands")
#   remote.sh served-all       issue 26: servers started by `launcher serve`, chat with images,
#                              `launcher bench`, both versions side by side (SERVED_JOBS; README)
#   remote.sh served           the same on vLLM 0.21.0 alone (SERVED_PHASES narrows)
#   remote.sh prepare          installs and patched copies only (before verbs run side by side)
#   remote.sh drafter-bg       retrain the drafter (DRAFTER_OVERRIDE) in the background meanwhile
#   remote.sh drafter-sweep    DRAFTER_SWEEP's recipes, one a GPU, in the background (sweep-wait
#                              keeps the best); then pack-drafter
#   remote.sh pack-drafter     that drafter alone into $OUT (extras-update-drafter), to copy back
#   remote.sh lanes-bg         RS_PARALLEL_21 / RS_PARALLEL_33 lanes of both releases in the background
#                              (RS_LANE_GPUS_21 / _33: the GPUs their lanes take, round-robin)
#                              (RS_WALK_NVFP4=1: nvfp4-reference beside them)
#   remote.sh lanes-wait       wait for them (LANES_WAIT_S), report, and bring their records back
#   remote.sh nvfp4-reference  the offline acceptance walk on the NVFP4 target (W4A4, W4A16)
#   remote.sh multinode-bg | multinode-wait   issue 54 on two GPUs: two `launcher serve` nodes
#                              against one process (tests/gpu/runs/multinode_served.py)
#   remote.sh speedup-frozen | speedup-curve   issue 53: the frozen step-time model, then the
#                              speed-up curve's batches (tests/gpu/README.md, "When DFlash pays")
#   remote.sh speedup-oracle-cost  the real drafter and the oracle timed in turn on one server
#   remote.sh bg VERB | bg-wait NAME   any verb detached, past one command's 600 s; then collected
#
# Files in /tmp survive between commands on the host, so the parts can arrive
# one command at a time and each round can run as a command of its own.
set -euo pipefail

BUNDLE_DIR=${BUNDLE_DIR:-/tmp/vllm-bundle}
SITE=${SITE:-/tmp/site}
SITE_PATCHED=${SITE_PATCHED:-/tmp/site-patched}
MODELS=${MODELS:-/tmp/models}
WORK=${WORK:-/tmp/gpu-proof}
OUT=${OUT:-$WORK/out}
PY=${PY:-python3}
STAGE=${STAGE:-.stage}

export VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
# NVLink multicast (NVLS) stays off: not every host allows it, and no test needs it.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

parts() { # tests/gpu/staging/parts.py on $BUNDLE_DIR: parts held, missing, the whole's sha256, assembled
    local cmd=$1; shift
    "$PY" tests/gpu/staging/parts.py "$cmd" "$BUNDLE_DIR" "$@"
}

assemble() { # assemble STEM: STEM's part paths in order, after checking the whole's sha256
    parts assemble "$1"
}

receive() { # copy the staged parts of every bundle (bundle.*, extras*.*) to $BUNDLE_DIR
    receive_parts
    [ -f "$BUNDLE_DIR/bundle.json" ] || { echo "no $STAGE/bundle.json staged yet" >&2; return 1; }
    parts_held
}

receive_trained() { # the packed checkpoints alone (extras-trained, no vLLM bundle needed): their
    # parts to $BUNDLE_DIR, and once all are there, unpacked into $MODELS_TRAINED and checked
    receive_parts
    parts_held
    local missing
    [ -f "$BUNDLE_DIR/extras-trained.json" ] || { echo "no $STAGE/extras-trained.json staged yet" >&2; return 1; }
    missing=$(parts missing extras-trained | grep -c . || true)
    [ "$missing" = 0 ] || { echo "extras-trained: $missing parts still to copy"; return 0; }
    extras && trained_identity_check
}

receive_parts() {
    "$PY" tests/gpu/staging/parts.py receive "$STAGE" "$BUNDLE_DIR"
    # The speed-up curve's references from an earlier host ($OUT/speedup-refs.tar.gz and the
    # lanes' speedup-curve-lane-I-refs.tar.gz, staged)
    local f
    for f in "$STAGE"/speedup-refs.tar.gz "$STAGE"/speedup-curve-lane-*-refs.tar.gz; do
        if [ -f "$f" ]; then cp "$f" "$BUNDLE_DIR/"; fi
    done
}

parts_held() { # per bundle manifest in $BUNDLE_DIR: the parts held (a part failing its sha256 is dropped)
    parts held
}

install_bundle() { # install_bundle STEM SITE REQUIREMENTS: one staged vLLM into its own folder (once;
    # tests/gpu/staging/install.py bundle), then imported
    local stem=$1 site=$2 reqs=$3
    [ -f "$site/.bundle-installed" ] && { echo "$stem already installed in $site"; return 0; }
    host_env "$PY" tests/gpu/staging/install.py bundle "$stem" "$site" "$reqs" || return 1
    PYTHONPATH=$site "$PY" -c 'import vllm, transformers, torch; print("vllm", vllm.__version__, "transformers", transformers.__version__, "torch", torch.__version__)'
}

host_env() { # host_env CMD...: CMD with the folders install.py reads (remote.sh's variables)
    BUNDLE_DIR=$BUNDLE_DIR WORK=$WORK SITE=$SITE SITE_PATCHED=$SITE_PATCHED MODELS_RS=$MODELS_RS \
        MODELS_TRAINED=$MODELS_TRAINED SITE_QUANT=$SITE_QUANT SITE_RAY=$SITE_RAY PY=$PY "$@"
}

install() { # vLLM 0.21.0 and its wheels into $SITE
    install_bundle bundle "$SITE" tests/gpu/bundle-requirements.txt
    host_deps
}

# vLLM 0.33.0 on the image's torch 2.11 (issue 12): its own folder, only the wheels the
# image lacks for it; FA2 travels inside its bundle (stage.py --vllm 0.33.0 --with-fa2).
V33=0.33.0
SITE33=${SITE33:-/tmp/site-$V33}
SITE33_PATCHED=${SITE33_PATCHED:-/tmp/site-$V33-patched}

install_v33() {
    install_bundle "bundle-$V33" "$SITE33" "tests/gpu/bundle-requirements-$V33.txt"
    host_deps
}

launcher_path() { # the launcher's imports (unidiff, typer): from 0.21.0's site, or 0.33.0's where
    # only its bundle was received (multinode-bg needs no other)
    echo ".:$SITE:$SITE33"
}

host_deps() { # reports run on plain "$PY" and name the current series (headline -> series_now ->
    # launcher.patching), whose one import the host's Python lacks is unidiff (pure Python): link it
    # from an installed bundle into a folder of its own, so no vLLM comes with it onto PYTHONPATH
    local d=$WORK/host-deps s
    for s in "$SITE" "$SITE33"; do
        [ -d "$s/unidiff" ] || continue
        mkdir -p "$d" && ln -sfn "$s/unidiff" "$d/unidiff"
        case ":${PYTHONPATH:-}:" in *":$d:"*) ;; *) export PYTHONPATH="$d${PYTHONPATH:+:$PYTHONPATH}" ;; esac
        return 0
    done
    return 0  # no bundle installed yet (receive): nothing to link
}

patched_site() { # patched_site [DEST [PATCHES_ROOT [FROM_SITE]]]: a copy of vLLM with the series applied
    local dest=${1:-$SITE_PATCHED} root=${2:-} from=${3:-$SITE}
    rm -rf "$dest" && mkdir -p "$dest"
    cp -a "$from/vllm" "$from"/vllm-*.dist-info "$dest/"
    if [ -z "$root" ]; then
        # The series as a user applies it (issue 26): the launcher's own command on the site.
        PYTHONPATH=$(launcher_path) "$PY" -m launcher patch apply --target "$dest"
        return
    fi
    PYTHONPATH=$(launcher_path) "$PY" tests/gpu/staging/sites.py apply "$dest" --patches-root "$root"
}

series_hash() { # series_hash [SITE [PATCHES_ROOT]]: the hash stamped into SITE when it was patched
    PYTHONPATH=$(launcher_path) "$PY" tests/gpu/staging/sites.py stamp "${1:-$SITE_PATCHED}" --patches-root "${2:-}" \
        2>/dev/null || true
}

site_is_current() { # site_is_current SITE [PATCHES_ROOT]: patched with this checkout's series
    PYTHONPATH=$(launcher_path) "$PY" tests/gpu/staging/sites.py current "$1" --patches-root "${2:-}" 2>/dev/null
}

SITE_PATCHED_MM=${SITE_PATCHED_MM:-/tmp/site-patched-mm}
MM_PATCHES=${MM_PATCHES:-/tmp/patches-mm}

REVERTED_SITES=${REVERTED_SITES:-/tmp/site-reverted}

reverted_sites() { # reverted_sites RUN_NAMES VERSION FROM_SITE: for each patch id those runs revert
    # (issue 25's ablation, the trace run without 0014), FROM_SITE's vLLM with VERSION's series
    # less that patch under $REVERTED_SITES/VERSION/<id> (its stamp names that series' hash,
    # which realshape.py records for each run from the tree it ran on)
    local v=$2 from=$3 ids id
    ids=$("$PY" tests/gpu/runs/realshape.py --models "$MODELS_TRAINED" --vllm "$v" --reverts-of "$1") || return 1
    for id in $ids; do reverted_site "$v" "$id" "$from"; done
}

reverted_site() { # reverted_site VERSION ID [FROM_SITE]: $REVERTED_SITES/VERSION/ID, VERSION's vLLM
    # (FROM_SITE, default the installed one) with this checkout's series less patch ID
    local v=$1 id=$2 from=${3:-} root=$WORK/patches-$1-without-$2
    [ -n "$from" ] || { if [ "$v" = 0.21.0 ]; then from=$SITE; else from=$SITE33; fi; }
    patches_without "$root" "$v" "$id" || return 1
    site_is_current "$REVERTED_SITES/$v/$id" "$root" \
        || patched_site "$REVERTED_SITES/$v/$id" "$root" "$from" > "$WORK/patch-apply-$v-without-$id.txt"
}

patches_without() { # patches_without DEST VERSION ID: this checkout's patches/ less VERSION's patch ID
    local dest=$1 v=$2 id=$3
    grep -q -- "-$id\.patch\$" "patches/vllm/$v/series" \
        || { echo "patches_without: $id is not in the $v series" >&2; return 1; }
    rm -rf "$dest" && cp -a patches "$dest"
    rm -f "$dest/vllm/$v"/*-"$id".patch
    sed -i "/-$id\.patch/d" "$dest/vllm/$v/series"
}

mm_patches_root() { # the series without gemma4-text-only-per-layer-attention-backend
    # Token-id prompts need the multimodal limits at 0, which that patch reads
    # as text-only serving. With images allowed (the gemma4-moe-dflash recipe)
    # it changes nothing, so the multimodal recipe's runs use the series
    # without it; their records hold that series' own hash.
    patches_without "$MM_PATCHES" 0.21.0 gemma4-text-only-per-layer-attention-backend
}

proof() {
    local rounds=("$@")
    [ ${#rounds[@]} -gt 0 ] || rounds=(stock patched)
    install
    mkdir -p "$OUT" "$WORK"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$WORK/gpu.txt"
    if ! grep -q t12-unscaled "$MODELS/shapes.json" 2>/dev/null; then
        PYTHONPATH=$SITE "$PY" tests/gpu/models/make_checkpoints.py "$MODELS" 2>&1 | grep -v "Writing model shards" || true
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
        "$PY" tests/gpu/runs/run_modes.py --models "$MODELS" --site "$site" --label "$r$suffix" \
            --out "$WORK/$r$suffix.json" --logs "$WORK/logs-$r$suffix" \
            --deadline-s "${ROUND_DEADLINE_S:-540}" "${extra[@]}"
        # Each finished round goes to $OUT at once, so a command cut short keeps it.
        cp "$WORK/$r$suffix.json" "$OUT/" 2>/dev/null || true
    done
    local have=()
    for r in stock patched stock-diag patched-diag; do
        [ -f "$WORK/$r.json" ] && have+=("$WORK/$r.json")
    done
    local hash=""
    [ -d "$SITE_PATCHED/vllm" ] && hash=$(series_hash)
    PYTHONPATH=$SITE "$PY" tests/gpu/staging/sites.py meta "$WORK/meta.json" --gpu-file "$WORK/gpu.txt" \
        --series-label "${hash:+patches/vllm/0.21.0 sha256 $hash}" \
        --command "bash tests/gpu/remote.sh proof (see tests/gpu/README.md)"
    "$PY" tests/gpu/judging/compare.py "${have[@]}" --meta "$WORK/meta.json" \
        --json "$OUT/results.json" --md "$OUT/results.md"
    local logs=()
    for r in "$WORK"/logs-* "$WORK"/patch-apply.txt; do [ -e "$r" ] && logs+=("$(basename "$r")"); done
    tar -C "$WORK" -czf "$OUT/logs.tar.gz" "${logs[@]}"
}

MODELS_RS=${MODELS_RS:-/tmp/models-rs}
SITE_QUANT=${SITE_QUANT:-/tmp/site-quant}
SITE_RAY=${SITE_RAY:-/tmp/site-ray}  # extras-ray (stage.py --ray): engine-check's Ray plans

extras() { # every extras* bundle staged: FA2 into the installed vLLM, checkpoints into $MODELS_RS
    # (tests/gpu/staging/install.py extras)
    host_env "$PY" tests/gpu/staging/install.py extras
}

realshape_meta() { # realshape_meta OUT.json [SITE HASH HASH_MM]: date, GPU, versions, series hashes, command
    local site=${2:-$SITE} hash=${3-$(series_hash)} hash_mm=${4-$(series_hash "$SITE_PATCHED_MM" "$MM_PATCHES")}
    PYTHONPATH=$site "$PY" tests/gpu/staging/sites.py meta "$1" --gpu-file "$WORK/gpu.txt" --series-hash "$hash" \
        --series-hash-mm "$hash_mm" --post-norm-scale "$(cat "$WORK/rs-scale" 2>/dev/null || true)" \
        --command "make gpu-realshape (tests/gpu/README.md, 'Real-shape proof')"
}

realshape() { # the real-shape proof (tests/gpu/runs/realshape.py); RUNS narrows it
    install
    extras
    mkdir -p "$OUT" "$WORK"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$WORK/gpu.txt"
    rs_models
    # Rebuilt when the series in this checkout changed since (a fix between two commands):
    # the patch engine's stamp says which series a tree holds.
    site_is_current "$SITE_PATCHED" || patched_site | tee "$WORK/patch-apply.txt"
    mm_patches_root
    site_is_current "$SITE_PATCHED_MM" "$MM_PATCHES" \
        || patched_site "$SITE_PATCHED_MM" "$MM_PATCHES" | tee "$WORK/patch-apply-mm.txt"
    realshape_meta "$WORK/rs-meta.json"
    realshape_py realshape-raw rs-meta.json --site-stock "$SITE" --site-patched "$SITE_PATCHED:$SITE" \
        --site-patched-mm "$SITE_PATCHED_MM:$SITE"
    tar -C "$WORK" -czf "$OUT/realshape-logs.tar.gz" realshape-raw
}

realshape_py() { # realshape_py RAW_DIR META ARGS..: realshape.py's runs (RUNS narrows), merged into $OUT
    local raw=$1 meta=$2 extra=()
    shift 2
    if [ ! -f "$OUT/realshape.json" ] && [ -f tests/gpu/results/realshape.json ]; then
        cp tests/gpu/results/realshape.json "$OUT/"
    fi
    [ -n "${RUNS:-}" ] && extra+=(--runs "$RUNS")
    "$PY" tests/gpu/runs/realshape.py --models "$MODELS_RS" --raw-dir "$WORK/$raw" --meta "$WORK/$meta" \
        --out "$OUT/realshape.json" --md "$OUT/realshape.md" --deadline-s "${ROUND_DEADLINE_S:-540}" \
        "$@" "${extra[@]}"
}

realshape_v33() { # the real-shape proof on vLLM 0.33.0 (issue 12); RUNS narrows it
    install   # 0.21.0's transformers 5.13.1 writes the checkpoints; 0.33.0 must load them on 5.17
    extras
    install_v33
    mkdir -p "$OUT" "$WORK"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$WORK/gpu.txt"
    rs_models
    site_is_current "$SITE33_PATCHED" || patched_site "$SITE33_PATCHED" "" "$SITE33" | tee "$WORK/patch-apply-v33.txt"
    # 0.33.0 reads image/video limits of 0 as text-only serving (is_mm_prefix_lm off),
    # so its runs use the whole series; no series-less-0004 tree is needed.
    realshape_meta "$WORK/rs-meta-v33.json" "$SITE33" "$(series_hash "$SITE33_PATCHED")" ""
    # 0.33.0 captures every CUDA graph twice at start (once to measure its memory); on
    # torch 2.11 with cold Triton caches the first pass took 156 s of a 4-minute start.
    # The KV pool is sized by gpu_memory_utilization either way.
    VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=${VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS:-0} \
        realshape_py realshape-raw-v33 rs-meta-v33.json --vllm "$V33" --site-stock "$SITE33" \
        --site-patched "$SITE33_PATCHED:$SITE33"
    tar -C "$WORK" -czf "$OUT/realshape-logs-v33.tar.gz" realshape-raw-v33
}

rs_models() { # the real-shape checkpoints on the device (RS_POST_NORM overrides the norm scale)
    if [ ! -f "$MODELS_RS/shapes.json" ]; then
        local extra=()
        local scale=${RS_POST_NORM:-$(cat "$WORK/rs-scale" 2>/dev/null || true)}
        [ -n "$scale" ] && extra+=(--post-norm-scale "$scale")
        PYTHONPATH=$SITE "$PY" tests/gpu/models/make_checkpoints.py "$MODELS_RS" --set realshape "${extra[@]}" 2>&1 \
            | grep -v "Writing model shards" || true
    fi
}

stability() { # bf16 vs fp32 greedy agreement of candidate real-shape targets, on the GPU;
    # the largest scale with full agreement and no near-ties becomes the real-shape target's
    install
    local scale dir line best="" fallback="" bestagree=-1 agree total near
    : > "$WORK/stability.txt"
    for scale in ${RS_SCALES:-0.3 0.15 0.08}; do
        dir=/tmp/models-stab-$scale
        [ -f "$dir/shapes.json" ] || PYTHONPATH=$SITE "$PY" tests/gpu/models/make_checkpoints.py "$dir" --set realshape \
            --post-norm-scale "$scale" 2>&1 | grep -v "Writing model shards" || true
        line=$(PYTHONPATH=$SITE "$PY" tests/gpu/models/bf16_stability.py "$dir" --device cuda 2>&1 | tail -1)
        echo "post_norm_scale $scale: $line" | tee -a "$WORK/stability.txt"
        read -r agree total near < <(echo "$line" | sed -E 's/.*agree at ([0-9]+)\/([0-9]+); fp32 near-ties ([0-9]+)/\1 \2 \3/')
        if [ -z "$best" ] && [ "$agree" = "$total" ] && [ "$near" = 0 ]; then best=$scale; fi
        if [ "$agree" -gt "$bestagree" ]; then bestagree=$agree; [ -z "$best" ] && fallback=$scale; fi
    done
    best=${best:-${fallback:-0.3}}
    echo "$best" > "$WORK/rs-scale"
    echo "chosen post_norm_scale: $best" | tee -a "$WORK/stability.txt"
    [ -n "${OUT:-}" ] && cp "$WORK/stability.txt" "$OUT/" || true
}

quantize_rs() { # the NVFP4 real-shape target by `launcher quantize` on this GPU (modelopt from extras-quant)
    install
    extras
    rs_models
    local target=$MODELS_RS/gemma4-a4b-r30
    [ -f "$target-nvfp4/hf_quant_config.json" ] && { echo "NVFP4 target already there"; return 0; }
    PYTHONPATH=.:$SITE_QUANT:$SITE "$PY" -m launcher quantize --model "$target" --out "$target-nvfp4" \
        --device cuda --calib-samples 8 --calib-seq-len 64 --force 2>&1 | grep -v "^Registered\|Loading weights" | tail -15
}

MODELS_TRAINED=${MODELS_TRAINED:-/tmp/models-trained}
TRAINED=$MODELS_TRAINED/trained-a4b-r30

train_target() { # the trained target (issue 23): corpus, tokenizer, training, drafter, prompts
    install
    mkdir -p "$OUT" "$WORK"
    # A checkpoint staged from another host (extras-trained, pack-trained) saves
    # the training; TRAIN_REPEAT=1 trains anyway and compares (run-to-run determinism).
    extras
    if [ -f "$MODELS_TRAINED/shapes.json" ]; then
        trained_identity_check
        if [ "${TRAIN_REPEAT:-0}" = 1 ]; then train_repeat; fi
    fi
    if [ ! -f "$MODELS_TRAINED/shapes.json" ] || ! bash -c "$(json_test "$TRAINED/train-record.json" polished_from)"; then
        # The gated target's recipe (issue 51): the first stage on the pinned corpus, its polish,
        # and the drafter for it, as target-bg runs them (with corpus.json's transformers 5.13.1,
        # which writes the config vLLM 0.21.0 reads); waited for here.
        POLISH=1 CHAIN_DRAFTER=1 target_background
        until [ -f "$WORK/target-bg.rc" ]; do sleep 30; done
        TARGET_WAIT_S=0 target_wait
        [ "$(cat "$WORK/target-bg.rc")" = 0 ] || { echo "the target recipe failed: $WORK/target-bg.out" >&2; return 1; }
    fi
    [ -f "$TRAINED/train-record.json" ] || { echo "no trained target (train.log)" >&2; return 1; }
    cp "$TRAINED/train-record.json" "$OUT/"
}

CORPUS_WHEELS=${CORPUS_WHEELS:-/tmp/corpus-wheels}
SITE_TRAIN=${SITE_TRAIN:-/tmp/site-train}
SITE_ZLAB=${SITE_ZLAB:-/tmp/site-zlab}

corpus_receive() { # the staged corpus.json wheels (.stage/corpus/) into $CORPUS_WHEELS, checked by
    # sha256; transformers 5.13.1 and dflash installed into $SITE_TRAIN (no vLLM bundle needed)
    mkdir -p "$CORPUS_WHEELS"
    [ -d "$STAGE/corpus" ] && cp --update=none "$STAGE"/corpus/*.whl "$CORPUS_WHEELS/"
    "$PY" tests/gpu/staging/parts.py corpus "$CORPUS_WHEELS"
    [ -d "$SITE_TRAIN/tokenizers" ] || "$PY" -m pip install -q --upgrade --no-index --no-deps --target "$SITE_TRAIN" \
        "$CORPUS_WHEELS"/transformers-*.whl "$CORPUS_WHEELS"/tokenizers-*.whl
    # z-lab's loop runs on the image's own transformers (5.15+): dflash alone in its own folder.
    [ -d "$SITE_ZLAB/dflash" ] || "$PY" -m pip install -q --upgrade --no-index --no-deps --target "$SITE_ZLAB" \
        "$CORPUS_WHEELS"/dflash-*.whl
}

zlab_reference() { # z-lab's dflash_generate on the trained target and drafter (zlab_reference.py)
    corpus_receive
    mkdir -p "$OUT"
    PYTHONPATH="$SITE_ZLAB" "$PY" tests/gpu/models/zlab_reference.py "$MODELS_TRAINED" \
        --drafter "${ZLAB_DRAFTER:-$(basename "$DRAFTER_TRAINED")}" --out "$OUT/zlab-reference.json"
}

EXTRA_WHEEL=transformers-5.13.1-py3-none-any.whl  # corpus.json's: the drafter's extra corpus

MODELS_POLISHED=${MODELS_POLISHED:-/tmp/models-polished}

target_background() { # train_target.py on the pinned corpus in a session of its own; with
    # POLISH=1 then its polish stage, which then takes $MODELS_TRAINED's place (the first stage
    # moves to $MODELS_TRAINED-first), so the verbs after it serve the polished target; with
    # POLISH_AGAIN=RECIPE a second polish on the polished target (train_target.py --polish-recipe;
    # the one before it moves to $MODELS_TRAINED-polished); with
    # CHAIN_DRAFTER=1 then train_drafter.py on it (only if its greedy probe passes the gate), the
    # extra corpus being corpus.json's transformers wheel: no vLLM bundle needed. What is on disk
    # already (trained, or restored by receive-trained: a polished target, a drafter for it) is
    # kept. target-wait follows it.
    corpus_receive
    mkdir -p "$WORK"
    if [ -f "$WORK/target-bg.out" ] && [ ! -f "$WORK/target-bg.rc" ]; then
        echo "target training already running ($WORK/target-bg.out)"; return 0
    fi
    rm -f "$WORK/target-bg.rc"
    snapshot_tree "$WORK/target-tree"
    local rec=$TRAINED/train-record.json name
    name=$(basename "$TRAINED")
    local steps="[ -f $rec ] || $PY tests/gpu/models/train_target.py $MODELS_TRAINED \
--corpus-wheels $CORPUS_WHEELS ${TRAIN_ARGS:-}"
    if [ "${POLISH:-0}" = 1 ]; then
        steps="$steps && { $(json_test "$rec" polished_from) || { \
{ [ -f $MODELS_POLISHED/$name/train-record.json ] || $PY tests/gpu/models/train_target.py $MODELS_POLISHED \
--corpus-wheels $CORPUS_WHEELS --polish $TRAINED; } && rm -rf $MODELS_TRAINED-first \
&& mv $MODELS_TRAINED $MODELS_TRAINED-first && mv $MODELS_POLISHED $MODELS_TRAINED; }; }"
    fi
    if [ -n "${POLISH_AGAIN:-}" ]; then  # a second polish (train_target.py POLISH_RECIPES) on the polished target
        case $POLISH_AGAIN in long|long-heavy) ;; *) echo "POLISH_AGAIN=$POLISH_AGAIN: long or long-heavy" >&2; return 2 ;; esac
        [ "$MODELS_POLISHED" != "$MODELS_TRAINED-polished" ] || { echo "MODELS_POLISHED is where the target before it goes" >&2; return 2; }
        steps="$steps && { $PY tests/gpu/staging/trained_pack.py polished-by $rec $POLISH_AGAIN || { \
{ [ -f $MODELS_POLISHED/$name/train-record.json ] || $PY tests/gpu/models/train_target.py $MODELS_POLISHED \
--corpus-wheels $CORPUS_WHEELS --polish $TRAINED --polish-recipe $POLISH_AGAIN; } && rm -rf $MODELS_TRAINED-polished \
&& mv $MODELS_TRAINED $MODELS_TRAINED-polished && mv $MODELS_POLISHED $MODELS_TRAINED; }; }"
    fi
    if [ "${CHAIN_DRAFTER:-0}" = 1 ]; then
        steps="$steps && $PY tests/gpu/staging/trained_pack.py gate $rec && { $(json_same "$DRAFTER_TRAINED/drafter-train-record.json" \
"$rec" target_sha256) || PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True $PY tests/gpu/models/train_drafter.py $MODELS_TRAINED \
--corpus-wheels $CORPUS_WHEELS --extra-corpus $CORPUS_WHEELS/$EXTRA_WHEEL \
${DRAFTER_OVERRIDE:+--override '$DRAFTER_OVERRIDE'} > $WORK/train-drafter.log 2>&1; }"
    fi
    detached "$WORK/target-tree" "$WORK/target-bg.out" "($steps); echo \$? > $WORK/target-bg.rc" \
        CUBLAS_WORKSPACE_CONFIG=:4096:8 PYTHONPATH="$SITE_TRAIN"
    echo "training in the background (log: $WORK/target-bg.out; remote.sh target-wait)"
}

json_test() { # json_test FILE KEY: a command line, true when FILE is JSON with a truthy KEY
    echo "$PY tests/gpu/staging/trained_pack.py has $1 $2"
}

json_same() { # json_same A B KEY: a command line, true when JSON files A and B hold the same KEY
    echo "$PY tests/gpu/staging/trained_pack.py same $1 $2 $3"
}

target_wait() { # wait up to TARGET_WAIT_S for target-bg; its progress; once ended, its records and log into $OUT
    local waited=0 limit=${TARGET_WAIT_S:-200}
    while [ ! -f "$WORK/target-bg.rc" ] && [ "$waited" -lt "$limit" ]; do sleep 10; waited=$((waited + 10)); done
    grep -v "^step\|^seq step .* seq " "$WORK/target-bg.out" | tail -n 12 || true
    grep "^step\|^seq step .* seq " "$WORK/target-bg.out" | tail -n 2 || true
    if [ -f "$WORK/train-drafter.log" ]; then
        # (grep finds no step line before the first one: not a failure of the wait)
        echo "drafter:"; { grep -v "^step" "$WORK/train-drafter.log" || true; } | tail -n 4
        { grep "^step" "$WORK/train-drafter.log" || true; } | tail -n 1
    fi
    [ -f "$WORK/target-bg.rc" ] || { echo "target-bg still running after ${waited}s"; return 0; }
    echo "target-bg ended: rc $(cat "$WORK/target-bg.rc")"
    mkdir -p "$OUT"
    cp "$WORK/target-bg.out" "$OUT/train.log"
    # The polished target's record is polish-record.json, the first stage's train-record.json.
    local first=$MODELS_TRAINED-first/$(basename "$TRAINED")/train-record.json
    if [ -f "$first" ]; then cp "$first" "$OUT/train-record.json"; fi
    if [ -f "$TRAINED/train-record.json" ]; then
        if bash -c "$(json_test "$TRAINED/train-record.json" polished_from)"; then
            cp "$TRAINED/train-record.json" "$OUT/polish-record.json"
        else
            cp "$TRAINED/train-record.json" "$OUT/"
        fi
    fi
    [ -f "$WORK/train-drafter.log" ] && cp "$WORK/train-drafter.log" "$OUT/"
    [ -f "$DRAFTER_TRAINED/drafter-train-record.json" ] && cp "$DRAFTER_TRAINED/drafter-train-record.json" "$OUT/"
    return 0
}

detached() { # detached DIR LOG SCRIPT [VAR=VALUE ...]: bash -c SCRIPT in DIR with those variables, in a
    # session of its own, its output to LOG; returns at once. The redirections belong to the
    # backgrounded group, not to setsid inside it: otherwise the group's shell waits for the job
    # holding the caller's stdout, and a command piped through `tail` ran to its time limit.
    local dir=$1 log=$2 script=$3
    shift 3
    (cd "$dir" && exec setsid nohup env "$@" bash -c "$script") > "$log" 2>&1 < /dev/null &
}

background_verb() { # bg VERB: remote.sh VERB detached, from a snapshot of this tree, so that it outlives a
    # command's 600 s (a machine's hold still bounds it); the calling environment goes with it
    # (SERVED_*, SPEEDUP_*, ...), its $OUT is $WORK/bg-NAME/out, and bg-wait NAME collects. NAME is
    # BG_NAME, by default VERB: one verb twice at once under two names (e.g. both releases' curves)
    local verb=${1:?bg VERB} name=${BG_NAME:-$1} dir short
    dir=$WORK/bg-$name
    if [ -f "$dir/run.log" ] && [ ! -f "$dir/rc" ]; then
        echo "$name already running in the background ($dir/run.log)"; return 0
    fi
    # A verb installs what is staged first: started while a bundle lacks parts, it would stop on
    # them, and the log would say so only at bg-wait
    short=$(parts incomplete | tr '\n' ' ') || true
    if [ -n "$short" ] && [ -z "${BG_PARTIAL_OK:-}" ]; then
        echo "bg $verb: staged bundles still lack parts (held/all: ${short% }): receive them first" \
            "(BG_PARTIAL_OK=1 starts it anyway)" >&2
        return 1
    fi
    rm -rf "$dir" && mkdir -p "$dir/out"
    : > "$dir/run.log"  # before the job starts, so that a second bg at once sees it running
    snapshot_tree "$dir/tree"
    detached "$dir/tree" "$dir/run.log" "bash tests/gpu/remote.sh $verb; echo \$? > $dir/rc" OUT="$dir/out"
    echo "$name in the background (log: $dir/run.log; remote.sh bg-wait $name)"
}

background_wait() { # bg-wait NAME: wait up to BG_WAIT_S (default 540) for bg's job NAME (its VERB, or its
    # BG_NAME), print its log's tail, and put what its $OUT holds into this command's $OUT, ended or
    # not (a run cut short still has records)
    local verb=${1:?bg-wait NAME} dir waited=0
    dir=$WORK/bg-$verb
    [ -f "$dir/run.log" ] || { echo "no bg $verb on this machine ($dir/run.log): run remote.sh bg $verb" >&2; return 1; }
    while [ ! -f "$dir/rc" ] && [ "$waited" -lt "${BG_WAIT_S:-540}" ]; do sleep 5; waited=$((waited + 5)); done
    tail -n "${BG_TAIL:-20}" "$dir/run.log"
    mkdir -p "$OUT"
    cp -r "$dir/out/." "$OUT/"
    # $OUT brings back 8 files: the log goes along only where there is room
    [ "$(find "$OUT" -maxdepth 1 -type f | wc -l)" -lt 8 ] && cp "$dir/run.log" "$OUT/bg-$verb.log"
    if [ -f "$dir/rc" ]; then echo "bg $verb ended: rc $(cat "$dir/rc")"; else echo "bg $verb still running after ${waited}s"; fi
}

snapshot_tree() { # snapshot_tree DEST: this tree less .stage, for a job that outlives the command (the
    # next command's copy of the repository replaces these files, and bash reads a script while it runs)
    rm -rf "$1" && mkdir -p "$1"
    tar --exclude=./.stage -cf - . | tar -xf - -C "$1"
}

DRAFTER_NEXT=$WORK/drafter-next  # drafter-bg's models folder: the target linked, the new drafter

drafter_background() { # train-drafter alone in a process session of its own, on the staged target
    # (extras-trained), while the next commands serve or run; DRAFTER_GPU_FRACTION caps its memory
    # (unset, it held 68-80 GB of an H100 and a server beside it could not start), and
    # DRAFTER_OVERRIDE / DRAFTER_STEPS pass
    # through. It writes into $DRAFTER_NEXT, so servers started meanwhile load the drafter they were
    # given, whole; wait_drafter (realshape's trained-drafter runs, pack-drafter) swaps it in.
    install
    extras
    mkdir -p "$WORK"
    if [ -f "$WORK/drafter-bg.asked" ] && [ ! -f "$WORK/drafter-bg.rc" ]; then
        echo "drafter training already running in the background ($WORK/drafter-bg.out)"; return 0
    fi
    [ -f "$TRAINED/train-record.json" ] || { echo "no target here: stage extras-trained (or train-target)" >&2; return 1; }
    rm -rf "$WORK/drafter-bg.rc" "$WORK/drafter-bg.out" "$DRAFTER_NEXT"
    mkdir -p "$DRAFTER_NEXT" && ln -s "$TRAINED" "$DRAFTER_NEXT/$(basename "$TRAINED")"
    snapshot_tree "$WORK/drafter-bg-tree"
    touch "$WORK/drafter-bg.asked"
    detached "$WORK/drafter-bg-tree" /dev/null \
        "bash tests/gpu/remote.sh train-drafter > $WORK/drafter-bg.out 2>&1; echo \$? > $WORK/drafter-bg.rc" \
        MODELS_TRAINED="$DRAFTER_NEXT" OUT="$WORK/train-bg-out"
    echo "drafter training in the background (log: $WORK/drafter-bg.out; runs of the trained drafter wait for it)"
}

SWEEP=$WORK/drafter-sweep  # drafter-sweep's slots: a models folder (the target linked), log and rc a GPU

drafter_sweep() { # DRAFTER_SWEEP, a JSON list of DrafterTrainConfig overrides: one train-drafter a GPU,
    # all at once, each in a session of its own (a host of four GPUs trains four recipes in the
    # time of one); sweep-wait keeps the drafter that accepts most on
    # the held-out prompts
    install
    extras
    [ -f "$TRAINED/train-record.json" ] || { echo "no target here: stage extras-trained (or train-target)" >&2; return 1; }
    local plan i extra override
    plan=$("$PY" tests/gpu/staging/trained_pack.py sweep-plan --gpus "${SWEEP_GPUS:-$(nvidia-smi -L | grep -c '^GPU')}") \
        || return 1
    rm -rf "$SWEEP" && mkdir -p "$SWEEP"
    snapshot_tree "$SWEEP/tree"
    while IFS=$'\t' read -r i extra override; do
        mkdir -p "$SWEEP/$i/models" "$SWEEP/$i/work"
        ln -s "$TRAINED" "$SWEEP/$i/models/$(basename "$TRAINED")"
        # A recipe whose extra_fraction is 0 gets no extra corpus (train_drafter.py refuses the pair).
        detached "$SWEEP/tree" /dev/null \
            "bash tests/gpu/remote.sh train-drafter > $SWEEP/$i/out 2>&1; echo \$? > $SWEEP/$i/rc" \
            CUDA_VISIBLE_DEVICES="$i" MODELS_TRAINED="$SWEEP/$i/models" WORK="$SWEEP/$i/work" \
            OUT="$SWEEP/$i/work/out" DRAFTER_OVERRIDE="$override" \
            DRAFTER_EXTRA_CORPUS="$(extra_corpus_if "$extra")"
        echo "slot $i (GPU $i): $override"
    done <<< "$plan"
}

sweep_wait() { # wait for drafter-sweep (SWEEP_WAIT_S at most, then report and return: call again);
    # once every slot has ended, the best drafter replaces $DRAFTER_TRAINED (trained_pack.py better)
    # and every slot's log and record go to $OUT as drafter-sweep.tar.xz
    [ -d "$SWEEP" ] || { echo "no drafter-sweep on this machine" >&2; return 1; }
    local deadline=$((SECONDS + ${SWEEP_WAIT_S:-540})) slots ended d
    slots=$(find "$SWEEP" -mindepth 1 -maxdepth 1 -name '[0-9]*' | wc -l)
    while ended=$(find "$SWEEP" -mindepth 2 -maxdepth 2 -name rc | wc -l); [ "$ended" -lt "$slots" ] \
            && [ $SECONDS -lt $deadline ]; do sleep 5; done
    for d in "$SWEEP"/[0-9]*; do
        # train-drafter.log has every line as it comes (the pipes are line-buffered: block-buffered,
        # a sweep 200 s in had shown nothing of its progress)
        echo "slot $(basename "$d"): rc $(cat "$d/rc" 2>/dev/null || echo running); \
$(grep -v '^step' "$d/work/train-drafter.log" 2>/dev/null | grep -v '^ ' | tail -2 | tr '\n' ' ') \
$(grep '^step' "$d/work/train-drafter.log" 2>/dev/null | tail -1)"
    done
    [ "$ended" -ge "$slots" ] || { echo "$ended of $slots slots ended: sweep-wait again"; return 0; }
    mkdir -p "$OUT"
    for d in "$SWEEP"/[0-9]*; do
        local next=$d/models/$(basename "$DRAFTER_TRAINED")
        [ "$(cat "$d/rc")" = 0 ] && [ -f "$next/drafter-train-record.json" ] || continue
        cp "$next/drafter-train-record.json" "$d/drafter-train-record.json"
        adopt_drafter "$next"
    done
    # What each slot left (a failed slot has no record): its output, whole log and record.
    (cd "$SWEEP" && find [0-9]* -maxdepth 2 \( -name out -o -name train-drafter.log \
        -o -name drafter-train-record.json \) -type f | sort | tar -cf - -T -) | xz -9 > "$OUT/drafter-sweep.tar.xz"
}

adopt_drafter() { # adopt_drafter DIR: a newly trained drafter replaces $DRAFTER_TRAINED unless it
    # accepts less on the held-out prompts (trained_pack.py better): such a retrain is recorded, not
    # swapped in. Returns 0 either way; nothing happens where DIR holds no train record.
    local next=$1
    [ -f "$next/drafter-train-record.json" ] || return 0
    if [ ! -f "$DRAFTER_TRAINED/drafter-train-record.json" ] || "$PY" tests/gpu/staging/trained_pack.py better \
            "$next/drafter-train-record.json" "$DRAFTER_TRAINED/drafter-train-record.json"; then
        rm -rf "$DRAFTER_TRAINED" && mv "$next" "$DRAFTER_TRAINED"
        echo "the new drafter ($next) replaces $DRAFTER_TRAINED"
    else
        echo "the new drafter ($next) accepts less held-out than $DRAFTER_TRAINED: kept the old one"
    fi
}

wait_drafter() { # block until a background drafter training (drafter-bg) has
    # ended; drafter-bg's drafter then replaces the one in $MODELS_TRAINED
    [ -f "$WORK/drafter-bg.asked" ] || return 0
    while [ ! -f "$WORK/drafter-bg.rc" ]; do sleep 5; done
    echo "background drafter training ended with $(cat "$WORK/drafter-bg.rc")"
    [ "$(cat "$WORK/drafter-bg.rc")" = 0 ] && adopt_drafter "$DRAFTER_NEXT/$(basename "$DRAFTER_TRAINED")"
    [ -f "$WORK/drafter-bg.out" ] || return 0  # the target failed: the drafter never started
    grep -v "^step" "$WORK/drafter-bg.out" | tail -12 || true
    mkdir -p "$OUT" && cp "$WORK/drafter-bg.out" "$OUT/train-drafter-bg.log"
    cp "$WORK"/train-bg-out/drafter-train-record.json "$OUT/" 2>/dev/null || true
}

seed_raw() { # seed_raw [RAW [DEST [SUFFIX]]]: raw reference records staged from an earlier
    # machine (.stage/RAW, default realshape-raw-trained, files *SUFFIX, default .raw.json) into
    # DEST (default $WORK/RAW) where this machine has none of its own: a DFlash run is judged
    # against them as against its own reference, target_sha256 permitting, and an oracle run
    # plans from them. DEST/seeded.txt names the copies (tests/gpu/staging/seeded.py): a merge reads
    # them as inputs, never in place of the newer record of their configuration
    local raw=${1:-realshape-raw-trained} f
    local d=$STAGE/$raw dest=${2:-$WORK/${1:-realshape-raw-trained}} suffix=${3:-.raw.json}
    [ -d "$d" ] || return 0
    mkdir -p "$dest"
    for f in "$d"/*"$suffix"; do
        [ -f "$f" ] && [ ! -f "$dest/$(basename "$f")" ] || continue
        cp "$f" "$dest/" && basename "$f" >> "$dest/seeded.txt"
        echo "seeded raw record: $(basename "$f")"
    done
}

trained_identity_check() { # the checkpoint on disk is the one its train record names
    "$PY" tests/gpu/staging/trained_pack.py identity "$TRAINED"
}

train_repeat() { # train again from scratch into a second folder: the same target_sha256 or not
    local again=$WORK/models-retrain
    rm -rf "$again"
    CUBLAS_WORKSPACE_CONFIG=:4096:8 PYTHONPATH=$SITE "$PY" tests/gpu/models/train_target.py "$again" \
        ${TRAIN_STEPS:+--steps "$TRAIN_STEPS"} ${TRAIN_UNLIKELIHOOD:+--unlikelihood "$TRAIN_UNLIKELIHOOD"} \
        > "$WORK/retrain.log" 2>&1 || true
    "$PY" tests/gpu/staging/trained_pack.py repeat "$TRAINED/train-record.json" \
        "$again/trained-a4b-r30/train-record.json" | tee "$OUT/train-repeat.json"
}

PACK_PART_BYTES=${PACK_PART_BYTES:-15900000}  # parts small enough that four and the manifest fit a transfer of 8 files of 16 MiB, 64 MiB in all

pack_trained() { # the trained checkpoints as an extras bundle; PACK_PARTS="0 1 2 3" of it into $OUT
    local pack=$WORK/pack i
    if [ ! -f "$pack/extras-trained.json" ]; then
        [ -f "$MODELS_TRAINED/shapes.json" ] || { echo "nothing to pack: train first" >&2; return 1; }
        trained_identity_check
        rm -rf "$pack" && mkdir -p "$pack"
        # Top folder models-trained/: extras() unpacks it into $MODELS_TRAINED.
        tar -C "$(dirname "$MODELS_TRAINED")" --transform "s,^$(basename "$MODELS_TRAINED"),models-trained," \
            -cf - "$(basename "$MODELS_TRAINED")" | split -d -a 2 -b "$PACK_PART_BYTES" - "$pack/extras-trained.tar.part"
        "$PY" tests/gpu/staging/trained_pack.py manifest "$pack" "$TRAINED/train-record.json"
    fi
    cp "$pack/extras-trained.json" "$OUT/"
    for i in ${PACK_PARTS:-}; do
        cp "$pack/extras-trained.tar.part$(printf %02d "$i")" "$OUT/"
    done
    ls "$pack"
}

DRAFTER_TRAINED=$MODELS_TRAINED/dflash-r5-trained

pack_drafter() { # a retrained drafter alone (about 11 MB, one part) as the extras-update-drafter
    # bundle, all of it into $OUT: extras() installs it after extras-trained (name order)
    local pack=$WORK/pack-drafter stem=extras-update-drafter
    wait_drafter
    drafter_is_current || { echo "no trained drafter for the target on disk: train-drafter first" >&2; return 1; }
    rm -rf "$pack" && mkdir -p "$pack" "$OUT"
    tar -C "$(dirname "$MODELS_TRAINED")" --transform "s,^$(basename "$MODELS_TRAINED"),models-trained," \
        -cf - "$(basename "$MODELS_TRAINED")/$(basename "$DRAFTER_TRAINED")" \
        | split -d -a 2 -b "$PACK_PART_BYTES" - "$pack/$stem.tar.part"
    "$PY" tests/gpu/staging/trained_pack.py manifest "$pack" "$TRAINED/train-record.json" --stem "$stem"
    cp "$pack"/* "$OUT/"
}

drafter_is_current() { # the trained drafter exists and was trained for the target now on disk
    bash -c "$(json_same "$DRAFTER_TRAINED/drafter-train-record.json" "$TRAINED/train-record.json" target_sha256)"
}

drafter_extra_corpus() { # the extra corpus the recipe (the defaults with DRAFTER_OVERRIDE) asks for, if any
    local override=${DRAFTER_OVERRIDE:-} plan
    [ -n "$override" ] || override='{}'
    # sweep-plan reads the recipe as train_drafter.py does, and refuses a bad one before the GPU.
    plan=$(DRAFTER_SWEEP="[$override]" "$PY" tests/gpu/staging/trained_pack.py sweep-plan --gpus 1) || return 1
    extra_corpus_if "$(cut -f2 <<< "$plan")"
}

extra_corpus_if() { # extra_corpus_if 0|1 (sweep-plan's column): DRAFTER_EXTRA_CORPUS, by default the
    # bundle's vllm/ sources, where the recipe needs one; nothing otherwise
    [ "$1" = 1 ] && echo "${DRAFTER_EXTRA_CORPUS:-$SITE/vllm}"
    return 0
}

train_drafter() { # the trained DFlash drafter (issue 25): train_drafter.py on the trained target
    install
    mkdir -p "$OUT" "$WORK"
    [ -f "$TRAINED/train-record.json" ] || { echo "train the target first: remote.sh train-target" >&2; return 1; }
    # DRAFTER_STEPS or DRAFTER_OVERRIDE (DrafterTrainConfig fields as JSON) ask for another
    # drafter: it replaces a staged one. A recipe with an extra_fraction (the default's 0.5
    # among them) takes those windows from DRAFTER_EXTRA_CORPUS, by default the bundle's own
    # vllm/ sources (pinned by the bundle's sha256, recorded by their own).
    local corpus
    if [ -n "${DRAFTER_STEPS:-}${DRAFTER_OVERRIDE:-}" ] || ! drafter_is_current; then
        # The recipe is read (a bad one refused) before the staged drafter is touched.
        corpus=$(drafter_extra_corpus) || return 1
        # A failed retraining must not leave the staged drafter looking current.
        rm -f "$DRAFTER_TRAINED/drafter-train-record.json"
        # The bundle's transformers 5.13.1 loads the target as vLLM 0.21.0's runs do. Expandable
        # segments: capped at 0.62 of an H100 the training went out of memory with 12 GB reserved
        # but unallocated; with them it fit in 0.7 (peak 42.7 GB) and made the same weights.
        PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True} \
        CUBLAS_WORKSPACE_CONFIG=:4096:8 PYTHONPATH=$SITE "$PY" tests/gpu/models/train_drafter.py "$MODELS_TRAINED" \
            ${DRAFTER_STEPS:+--steps "$DRAFTER_STEPS"} ${DRAFTER_OVERRIDE:+--override "$DRAFTER_OVERRIDE"} \
            ${corpus:+--extra-corpus "$corpus"} \
            ${DRAFTER_GPU_FRACTION:+--gpu-fraction "$DRAFTER_GPU_FRACTION"} 2>&1 \
            | grep --line-buffered -v "Loading weights" \
            | tee "$WORK/train-drafter.log" | grep --line-buffered -v "^step" || true
        grep "^step" "$WORK/train-drafter.log" | awk 'NR % 8 == 1' || true
        cp "$WORK/train-drafter.log" "$OUT/"
    fi
    drafter_is_current || { echo "no trained drafter for this target (train-drafter.log)" >&2; return 1; }
    cp "$DRAFTER_TRAINED/drafter-train-record.json" "$OUT/"
}

nvfp4_reference() { # issue 25: the offline walk on the NVFP4 target (nvfp4_reference.py), the reference of
    # the NVFP4 rows; W4A4 (an RTX 5090's FP4 GEMMs, vLLM's emulation) and W4A16 (Hopper's Marlin)
    install
    extras
    trained_setup
    mkdir -p "$OUT"
    local numerics
    for numerics in "" --weights-only; do
        CUBLAS_WORKSPACE_CONFIG=:4096:8 PYTHONPATH=$SITE "$PY" tests/gpu/models/nvfp4_reference.py "$MODELS_TRAINED" \
            $numerics 2>&1 | grep -v "Loading weights" | tail -3
    done
    cp "$DRAFTER_TRAINED"/nvfp4-evaluation*.json "$OUT/"
}

trained_nvfp4() { # the trained target's NVFP4 copy by `launcher quantize` (modelopt from extras-quant)
    extras
    # A copy staged from an earlier run (extras-trained) needs no quantizer.
    nvfp4_makeable "NVFP4 runs" || return 1
    if [ ! -f "$TRAINED-nvfp4/hf_quant_config.json" ]; then
        PYTHONPATH=.:$SITE_QUANT:$SITE "$PY" -m launcher quantize --model "$TRAINED" --out "$TRAINED-nvfp4" \
            --device cuda --calib-file "$MODELS_TRAINED/calib.jsonl" --calib-samples 32 --calib-seq-len 512 \
            --force 2>&1 | grep -v "^Registered\|Loading weights" | tail -15
    fi
    # vLLM reads the run's prompts and the record from the NVFP4 folder too.
    cp "$TRAINED/prompts.json" "$TRAINED/train-record.json" "$TRAINED-nvfp4/" 2>/dev/null || true
}

realshape_trained() { # the proof on the trained target, vLLM 0.21.0, whole series (RUNS narrows);
    # realshape.py runs each oracle run after its reference when both are asked for
    install
    extras
    # Not `trained_setup || return 1`: bash ignores set -e inside a function called that way.
    trained_setup
    site_is_current "$SITE_PATCHED" || patched_site | tee "$WORK/patch-apply.txt"
    reverted_sites "${RUNS:-};${RS_PARALLEL:-}" 0.21.0 "$SITE"
    realshape_meta "$WORK/rs-meta-trained.json" "$SITE" "$(series_hash)" ""
    trained_lanes 0.21.0 realshape-raw-trained rs-meta-trained.json \
        --site-stock "$SITE" --site-patched "$SITE_PATCHED:$SITE" --reverted-sites "$REVERTED_SITES/0.21.0"
}

realshape_v33_trained() { # the trained target on vLLM 0.33.0 (issues 24, 25): the v33-trained-* runs
    install   # the trained target, its NVFP4 copy and the drafter are made with 0.21.0's bundle
    extras
    install_v33
    trained_setup
    seed_raw realshape-raw-v33-trained
    site_is_current "$SITE33_PATCHED" || patched_site "$SITE33_PATCHED" "" "$SITE33" | tee "$WORK/patch-apply-v33.txt"
    reverted_sites "${RUNS:-};${RS_PARALLEL:-}" "$V33" "$SITE33"
    realshape_meta "$WORK/rs-meta-v33-trained.json" "$SITE33" "$(series_hash "$SITE33_PATCHED")" ""
    # As realshape-v33: 0.33.0's first, measuring CUDA-graph capture took 156 s of a start.
    VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=${VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS:-0} \
        trained_lanes "$V33" realshape-raw-v33-trained rs-meta-v33-trained.json \
        --site-stock "$SITE33" --site-patched "$SITE33_PATCHED:$SITE33" --reverted-sites "$REVERTED_SITES/$V33"
}

trained_setup() { # what every trained-target run needs: the target (and the drafter when asked
    # for), the staged raw references, the NVFP4 copy
    mkdir -p "$OUT" "$WORK"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$WORK/gpu.txt"
    case "${RUNS:-}${RS_PARALLEL:-}" in *dflash-trained*) wait_drafter ;; esac
    [ -f "$MODELS_TRAINED/shapes.json" ] || { echo "train first: remote.sh train-target" >&2; return 1; }
    seed_raw
    # bf16 runs need no NVFP4 copy, so they do not make one.
    case "${RUNS:-}${RS_PARALLEL:-}" in ""|*nvfp4*) trained_nvfp4 ;; esac
}

trained_lanes() { # trained_lanes VLLM RAW META SITE_ARGS..: RS_PARALLEL lanes side by side, or RUNS
    # (default: every trained run of VLLM) in one, merged into $OUT; then the acceptance report
    local v=$1 raw=$2 meta=$3
    shift 3
    mkdir -p "$WORK/$raw"
    if [ -n "${RS_PARALLEL:-}" ]; then
        # RS_PARALLEL="a,b;c,d": each lane runs its runs in order, lanes side by side on
        # the GPU (engine start-up is mostly CPU: compile and graph capture). Lanes
        # write raw runs only; one merge judges them all at the end.
        # An oracle run (issue 24) makes its plan from its reference's raw record: refuse
        # lanes where that record may be absent or rewritten while the oracle run starts.
        # RS_LANE_GPUS="0,1,2,3" (a machine of several GPUs): lane i runs on the i-th, round-robin.
        "$PY" tests/gpu/runs/realshape.py --models "$MODELS_TRAINED" --raw-dir "$WORK/$raw" \
            --check-lanes "$RS_PARALLEL" --vllm "$v" ${RS_LANE_GPUS:+--lane-gpus "$RS_LANE_GPUS"} || return 1
        # Each lane's process on its GPU (RS_LANE_GPUS), RS_LANE_STAGGER_S apart, its log
        # $WORK/$raw-lane-I.log (realshape.py --run-lanes; RS_GPU_UTIL, RS_KV_CACHE_GIB pass through).
        "$PY" tests/gpu/runs/realshape.py --models "$MODELS_TRAINED" --raw-dir "$WORK/$raw" --vllm "$v" \
            --deadline-s "${ROUND_DEADLINE_S:-540}" --run-lanes "$RS_PARALLEL" ${RS_LANE_GPUS:+--lane-gpus "$RS_LANE_GPUS"} \
            --lane-stagger-s "${RS_LANE_STAGGER_S:-20}" "$@"
    else
        local names
        names=${RUNS:-$("$PY" -c 'import sys; sys.path.insert(0, "tests/gpu"); import gpu_paths, realshape as r; print(",".join(n for n, s in r.RUNS.items() if s.trained and s.vllm == sys.argv[1]))' "$v")}
        MODELS_RS=$MODELS_TRAINED RUNS=$names realshape_py "$raw" "$meta" --vllm "$v" "$@"
    fi
    # The reference walk along each DFlash run's own text (seconds on the GPU), then the merge
    # that puts it beside vLLM's acceptance (the runs' records as they were otherwise). Its log
    # lives with the raw records, so the logs tarball and lanes.tgz bring it back.
    "$PY" tests/gpu/runs/walk_along.py --models "$MODELS_TRAINED" --raw "$WORK/$raw" --device cuda --write \
        > "$WORK/$raw/walk-along.log" 2>&1 || tail -5 "$WORK/$raw/walk-along.log"
    MODELS_RS=$MODELS_TRAINED realshape_py "$raw" "$meta" --vllm "$v" --merge-only "$@"
    tar -C "$WORK" -czf "$OUT/${raw/realshape-raw/realshape-logs}.tar.gz" "$raw"
    [ -f "$OUT/realshape.json" ] && "$PY" tests/gpu/reports/acceptance_report.py --realshape "$OUT/realshape.json" --out-dir "$OUT"
    return 0
}

lanes_background() { # RS_PARALLEL_21 / RS_PARALLEL_33: realshape-trained and realshape-v33-trained
    # side by side, each in a session of its own from a snapshot of this tree (the next command's copy
    # replaces these files), so they outlive the command that started them; lanes-wait reports and collects.
    # Run `prepare` first: the two verbs must not build the same folders at once.
    mkdir -p "$WORK"
    local tree=$WORK/lanes-tree v verb lanes gpus
    lane_gpus_disjoint || return 1
    lanes_check || return 1
    snapshot_tree "$tree"
    mkdir -p "$tree/.stage"
    cp -r "$STAGE"/realshape-raw-* "$tree/.stage/" 2>/dev/null || true  # seed_raw's staged references
    for v in 21 33; do
        lanes=RS_PARALLEL_$v gpus=RS_LANE_GPUS_$v
        [ -n "${!lanes:-}" ] || continue
        verb=realshape-trained; [ "$v" = 33 ] && verb=realshape-v33-trained
        rm -f "$WORK/lanes-$v.rc" && rm -rf "$WORK/lanes-out-$v"
        detached "$tree" /dev/null "bash tests/gpu/remote.sh $verb > $WORK/lanes-$v.log 2>&1; echo \$? > $WORK/lanes-$v.rc" \
            RS_PARALLEL="${!lanes}" RS_LANE_GPUS="${!gpus:-}" OUT="$WORK/lanes-out-$v" \
            ROUND_DEADLINE_S="${ROUND_DEADLINE_S:-1800}" RS_CHILD_TIMEOUT_S="${RS_CHILD_TIMEOUT_S:-900}"
        echo "$verb in the background: ${!lanes} (log: $WORK/lanes-$v.log)"
        sleep "${LANES_STAGGER_S:-30}"
    done
    # RS_WALK_NVFP4=1: the NVFP4 walk beside them (minutes on the GPU).
    if [ -n "${RS_WALK_NVFP4:-}" ]; then
        rm -f "$WORK/lanes-walk.rc" && rm -rf "$WORK/lanes-out-walk"
        detached "$tree" /dev/null "bash tests/gpu/remote.sh nvfp4-reference > $WORK/lanes-walk.log 2>&1; echo \$? > $WORK/lanes-walk.rc" \
            OUT="$WORK/lanes-out-walk"
        echo "nvfp4-reference in the background (log: $WORK/lanes-walk.log)"
    fi
}

nvfp4_makeable() { # nvfp4_makeable WHAT: the trained target's NVFP4 copy is here or can be made
    # (extras-quant's quantizer), else WHAT is refused with what to stage
    [ -f "$TRAINED-nvfp4/hf_quant_config.json" ] || [ -d "$SITE_QUANT" ] && return 0
    echo "$1, but no NVFP4 copy of the trained target and no quantizer: stage extras-quant (stage.py --extras" \
        "--extras-name extras-quant --no-fa2 --quant-wheels) or an extras-trained that holds the copy" >&2
    return 1
}

lanes_check() { # both releases' lanes checked as their verbs will check them (run names, release,
    # speed runs' GPUs, oracle references, an NVFP4 copy for NVFP4 runs), before anything starts:
    # in the background a typo would show only minutes later, in a log
    local v lanes gpus raw release
    [ -z "${RS_WALK_NVFP4:-}" ] || nvfp4_makeable "RS_WALK_NVFP4: the NVFP4 walk" || return 1
    for v in 21 33; do
        lanes=RS_PARALLEL_$v gpus=RS_LANE_GPUS_$v
        [ -n "${!lanes:-}" ] || continue
        raw=realshape-raw-trained release=0.21.0
        [ "$v" = 33 ] && raw=realshape-raw-v33-trained release=$V33
        case "${!lanes}" in *nvfp4*) nvfp4_makeable "RS_PARALLEL_$v: NVFP4 runs" || return 1 ;; esac
        seed_raw "$raw" > /dev/null   # as the verb will, so a staged reference counts
        "$PY" tests/gpu/runs/realshape.py --models "$MODELS_TRAINED" --raw-dir "$WORK/$raw" --vllm "$release" \
            --check-lanes "${!lanes}" ${!gpus:+--lane-gpus "${!gpus}"} > "$WORK/lanes-check-$v.txt" \
            || { sed "s/^/RS_PARALLEL_$v: /" "$WORK/lanes-check-$v.txt" >&2; return 1; }
    done
}

lane_gpus_disjoint() { # RS_LANE_GPUS_21 / RS_LANE_GPUS_33: where both releases' lanes run and either
    # names GPUs, both name them and share none (a lane without GPUs runs on the first one, and each
    # verb checks only its own lanes' speed runs)
    [ -n "${RS_PARALLEL_21:-}" ] && [ -n "${RS_PARALLEL_33:-}" ] || return 0
    [ -z "${RS_LANE_GPUS_21:-}${RS_LANE_GPUS_33:-}" ] && return 0
    if [ -z "${RS_LANE_GPUS_21:-}" ] || [ -z "${RS_LANE_GPUS_33:-}" ]; then
        echo "RS_LANE_GPUS_21 and RS_LANE_GPUS_33: name both or neither (lanes without run on GPU 0)" >&2; return 1
    fi
    local shared
    shared=$(comm -12 <(tr ',' '\n' <<< "$RS_LANE_GPUS_21" | sort -u) <(tr ',' '\n' <<< "$RS_LANE_GPUS_33" | sort -u) | paste -sd,)
    [ -z "$shared" ] || { echo "RS_LANE_GPUS_21 and RS_LANE_GPUS_33 share GPU $shared: give each release its own" >&2; return 1; }
}

lanes_wait() { # wait up to LANES_WAIT_S (default 480) for lanes-bg's verbs, say where each lane is,
    # and put what exists into $OUT/lanes.tgz (records, raw records, logs), ended or not
    local waited=0 v pending lanes="21 33 walk"
    # A host that never ran lanes-bg (a fresh one) has nothing to wait for,
    # and saying "done" there would pass for lanes that ended
    ls "$WORK"/lanes-*.log > /dev/null 2>&1 || {
        echo "no lanes on this machine ($WORK has no lanes-*.log): it is not the one that ran lanes-bg" \
            "(a machine goes back when idle); stage again and rerun lanes-bg" >&2
        return 1; }
    while :; do
        pending=0
        for v in $lanes; do
            [ -f "$WORK/lanes-$v.log" ] && [ ! -f "$WORK/lanes-$v.rc" ] && pending=1
        done
        [ "$pending" = 0 ] || [ "$waited" -ge "${LANES_WAIT_S:-480}" ] && break
        sleep 5; waited=$((waited + 5))
    done
    for v in $lanes; do
        [ -f "$WORK/lanes-$v.log" ] || continue
        echo "lanes $v: $([ -f "$WORK/lanes-$v.rc" ] && echo "ended with $(cat "$WORK/lanes-$v.rc")" || echo running)"
        tail -3 "$WORK/lanes-$v.log"
    done
    mkdir -p "$OUT"
    (cd "$WORK" && tar -czf "$OUT/lanes.tgz" --ignore-failed-read $(ls -d lanes-out-* lanes-*.log \
        realshape-raw-trained realshape-raw-v33-trained realshape-raw-*-lane-*.log rs-meta-*trained.json 2>/dev/null)) || true
    [ "$pending" = 0 ] || return 1
    # A lane that ended badly fails the wait, so the merges after it do not read its gap as a page
    local failed=""
    for v in $lanes; do
        [ -f "$WORK/lanes-$v.rc" ] && [ "$(cat "$WORK/lanes-$v.rc")" != 0 ] && failed="$failed $v"
    done
    [ -z "$failed" ] || { echo "lanes that ended with an error:$failed (their logs above, all in \$OUT/lanes.tgz)" >&2; return 1; }
}

gpu_slug() { # the first GPU of $WORK/gpu.txt (nvidia-smi's name line) as a file name's part: h200
    head -n 1 "$WORK/gpu.txt" 2>/dev/null | sed -E 's/^NVIDIA ([^,]*).*/\1/' | tr 'A-Z ' 'a-z-'
}

archive_lanes() { # the lanes' records and logs ($OUT/lanes.tgz, what lanes-wait packed) beside the
    # results, where rejudge and the acceptance headline read raw records:
    # results/realshape-logs/DATE-GPU-trained-TARGET-DRAFTER-lanes.tar.xz (hash prefixes)
    [ -f "$OUT/lanes.tgz" ] || { echo "no $OUT/lanes.tgz to archive: lanes-wait packs it" >&2; return 1; }
    local gpu hashes dest tmp
    gpu=$(gpu_slug)
    hashes=$("$PY" -c 'import json, sys
print("-".join((json.load(open(f)).get(k) or "none")[:8] for f, k in zip(sys.argv[1:], ("target_sha256", "drafter_sha256"))))' \
        "$TRAINED/train-record.json" "$DRAFTER_TRAINED/drafter-train-record.json" 2>/dev/null) || hashes=unknown
    dest=tests/gpu/results/realshape-logs/$(date -u +%F)-${gpu:-gpu}-trained-$hashes-lanes.tar.xz
    tmp=$(mktemp -d)
    tar -xzf "$OUT/lanes.tgz" -C "$tmp" && mkdir -p "$(dirname "$dest")" && tar -C "$tmp" -cJf "$dest" . && rm -rf "$tmp"
    echo "$dest"
}

served() { # issue 26 on vLLM 0.21.0: `launcher serve` servers, chat with images, `launcher bench`
    # (tests/gpu/runs/served.py). SERVED_PHASES narrows (reference, dflash, stock, bench); a 10-minute
    # bound holds about two of them. Raw phases stay in $WORK/served between runs, and every run
    # re-renders served.json / served.md from all of them.
    prepare
    require_fa2
    served_run "$SITE" "$SITE_PATCHED" served
}

require_fa2() { # the servers force FLASH_ATTN as sm_12x runs it (FA2): 0.21.0's comes in extras-fa2
    [ -f "$SITE/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so" ] \
        || { echo "no FA2 in $SITE: carry extras-fa2 (stage.py --extras --extras-name extras-fa2)" >&2; return 1; }
}

prepare() { # both releases installed (0.33.0 where its bundle is staged), FA2 and the trained
    # models unpacked, the patched copies built: what served-all, realshape-trained and
    # realshape-v33-trained each start with, done once before they run side by side (each would
    # otherwise build the same folders at once). Under a lock: a prepare started in the
    # background during the receive calls and the one a verb starts must not build together.
    mkdir -p "$WORK"
    (
        flock 9
        install
        extras
        site_is_current "$SITE_PATCHED" || patched_site | tee "$WORK/patch-apply.txt"
        if [ -f "$BUNDLE_DIR/bundle-$V33.json" ]; then
            install_v33
            site_is_current "$SITE33_PATCHED" || patched_site "$SITE33_PATCHED" "" "$SITE33" | tee "$WORK/patch-apply-v33.txt"
        fi
    ) 9> "$WORK/prepare.lock"
}

engine_check() { # every multi-node plan's node argv (multinode_engine_check.py --dump DIR --version V,
    # made with the launcher's Python into $MULTINODE_DUMP) through vLLM V's parser and, on this GPU
    # host, its create_engine_config too (--require-engine-config); V is ENGINE_CHECK_VERSION
    # (0.33.0 or 0.21.0, the staged bundles); the verdicts into $OUT. With extras-ray staged
    # (stage.py --ray), Ray is on PYTHONPATH, and the output's first line names its version.
    local version=${ENGINE_CHECK_VERSION:-$V33} site ray=""
    receive_parts
    if [ "$version" = "$V33" ]; then install_v33; site=$SITE33; else install; site=$SITE; fi
    if [ -f "$BUNDLE_DIR/extras-ray.json" ]; then extras && ray=:$SITE_RAY; fi
    mkdir -p "$OUT"
    {
        if [ -n "$ray" ]; then PYTHONPATH=$site$ray "$PY" -c "import ray; print('ray', ray.__version__, 'from', ray.__file__)" 2>&1 | tail -n 3 || true
        else echo "ray: not staged (stage.py --ray)"; fi
        PYTHONPATH=.:$site$ray "$PY" tests/integration/multinode_engine_check.py "${MULTINODE_DUMP:?the plans folder}" \
            --require-engine-config 2>&1 | grep -v "^WARNING\|^INFO"
    } | tee "$OUT/multinode-engine-check-$version.txt"
}

multinode_background() { # issue 54 on a host with two GPUs: multinode_served.py (two `launcher serve`
    # nodes, one GPU each, against one process with TP 2 and with TP 1) on patched vLLM 0.33.0,
    # detached, since its servers outlast one 10-minute command; multinode-wait follows it.
    # MN_SERVERS narrows; MN_MODEL / MN_DRAFTER (default: the trained target and its drafter)
    [ "$(nvidia-smi -L | wc -l)" -ge 2 ] || { echo "multinode needs a host with two GPUs" >&2; return 1; }
    receive_parts
    install_v33
    site_is_current "$SITE33_PATCHED" || patched_site "$SITE33_PATCHED" "" "$SITE33" | tee "$WORK/patch-apply-v33.txt"
    if [ -f "$WORK/multinode.out" ] && [ ! -f "$WORK/multinode.rc" ]; then
        echo "multinode already running ($WORK/multinode.out)"; return 0
    fi
    rm -f "$WORK/multinode.rc"
    snapshot_tree "$WORK/multinode-tree"
    local gpu script drafter=${MN_DRAFTER:-}
    # The trained drafter where there is one for this target (drafts accepted and rejected), else the random one
    if [ -z "$drafter" ]; then
        if drafter_is_current; then drafter=$DRAFTER_TRAINED; else drafter=$MODELS_TRAINED/dflash-r5-for-trained; fi
    fi
    gpu="$(nvidia-smi -L | wc -l) x $(nvidia-smi --query-gpu=name --format=csv,noheader | head -n1)"
    script="PYTHONPATH=$(launcher_path) $PY tests/gpu/runs/multinode_served.py --model ${MN_MODEL:-$TRAINED} \
--drafter $drafter --site $SITE33_PATCHED:$SITE33 --work $WORK/multinode \
--out $WORK/multinode-out --servers ${MN_SERVERS:-tp1,tp2,nodes2,tp2-dflash,nodes2-dflash} --vllm $V33 \
--series-hash $(series_hash "$SITE33_PATCHED") --gpu '$gpu'"
    detached "$WORK/multinode-tree" "$WORK/multinode.out" "$script; echo \$? > $WORK/multinode.rc" \
        VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0
    echo "multinode in the background (log: $WORK/multinode.out; remote.sh multinode-wait)"
}

multinode_wait() { # wait up to MN_WAIT_S (default 480) for multinode-bg; its progress; its record and the
    # servers' logs into $OUT (whenever asked: a record cut short is still one)
    local waited=0 limit=${MN_WAIT_S:-480}
    while [ ! -f "$WORK/multinode.rc" ] && [ "$waited" -lt "$limit" ]; do sleep 10; waited=$((waited + 10)); done
    grep "^\[" "$WORK/multinode.out" | tail -n 12 || true
    mkdir -p "$OUT"
    cp "$WORK"/multinode-out/multinode.* "$OUT/" 2>/dev/null || true
    tar -C "$WORK" -czf "$OUT/multinode-logs.tar.gz" multinode.out $(cd "$WORK" && ls -d multinode/*.log 2>/dev/null) || true
    [ -f "$WORK/multinode.rc" ] && echo "multinode ended: rc $(cat "$WORK/multinode.rc")" || echo "multinode still running after ${waited}s"
}

served_all() { # served and served-v33 side by side, each with its phases side by side
    # (tests/gpu/runs/served_all.py: the jobs, their ports and GPUs, the logs, what comes back).
    # SERVED_JOBS: space-separated RECIPE:PHASES[:exact|default], each run on both versions, or on
    # SERVED_VERSIONS (default: the multimodal recipe, SERVED_PHASES, SERVED_EXACT's numerics);
    # SERVED_GPUS="0,1": job i on the i-th GPU, round-robin.
    # One H100 holds the servers: each gets an explicit KV cache (SERVED_KV_GIB, 4 GiB: vLLM then
    # sizes nothing from a memory profile, which the other servers' allocations would skew; 0.21.0
    # even asserts when another process frees memory during its profile) and a memory fraction
    # of SERVED_GPU_UTIL (0.1) for vLLM's start-up check that the fraction is free (--test-gpu's
    # 0.321, an RTX 5090's budget, would not be free for the last ones). started_by shows both.
    prepare
    require_fa2
    mkdir -p "$OUT"
    local kv=$(( ${SERVED_KV_GIB:-4} * 1073741824 )) v
    local jobs=${SERVED_JOBS:-gemma4-moe-dflash:${SERVED_PHASES:-reference,dflash,stock}}
    local versions=${SERVED_VERSIONS:-0.21.0 0.33.0}
    # SERVED_ALL_PORT_BASE: the first job's ports (default 8000), for a second served-all beside one
    local plan=("$PY" tests/gpu/runs/served_all.py --jobs "$jobs" --versions "$versions" --gpus "${SERVED_GPUS:-}"
        --zlab "${SERVED_ZLAB:-$OUT/zlab-reference.json}" --port-base "${SERVED_ALL_PORT_BASE:-8000}")
    "${plan[@]}" check || return 2
    # A version "V-without-ID" serves V's series less patch ID (issue 50: 0.21.0 without
    # dflash-drafter-per-layer-attention): its tree is built here, before the jobs start side by side.
    for v in $versions; do
        case "$v" in *-without-*) reverted_site "${v%%-without-*}" "${v#*-without-}" || return 1 ;; esac
    done
    export SERVED_COMMAND="SERVED_JOBS='$jobs' SERVED_VERSIONS='$versions'${SERVED_GPUS:+ SERVED_GPUS='$SERVED_GPUS'}${SERVED_ALL_PORT_BASE:+ SERVED_ALL_PORT_BASE=$SERVED_ALL_PORT_BASE} SERVED_DEADLINE_S=${SERVED_DEADLINE_S:-540} bash tests/gpu/remote.sh served-all"
    export SERVED_PARALLEL=1 SERVED_SETS="${SERVED_SETS:-} serve.gpu_memory_utilization=${SERVED_GPU_UTIL:-0.1}"
    export SERVED_VLLM_ARGS="${SERVED_VLLM_ARGS:-} --kv-cache-memory-bytes=$kv"
    # 0.33.0 captures every CUDA graph twice at start, once to estimate its memory, which an
    # explicit KV cache does not use (the real-shape runs set the same; not in issue 27's fit runs)
    export VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=${VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS:-0}
    "${plan[@]}" run --work "$WORK" --out "$OUT" --stagger-s "${SERVED_JOB_STAGGER_S:-20}" \
        --command "${SERVED_RUN:-bash tests/gpu/remote.sh served-run}" --site "$SITE" --site-patched "$SITE_PATCHED" \
        --site33 "$SITE33" --site33-patched "$SITE33_PATCHED" --reverted "$REVERTED_SITES"
}

served_run() { # served_run SITE PATCHED_SITE NAME: served.py's phases in $WORK/NAME[-text]
    # SERVED_RECIPE=gemma4-moe-dflash-text serves the text-only recipe (folder NAME-text)
    local recipe=${SERVED_RECIPE:-gemma4-moe-dflash}
    local site=$1 patched=$2 name=$3${recipe#gemma4-moe-dflash}
    local work=$WORK/$name drafter=${SERVED_DRAFTER:-} extra=() item
    # The trained drafter where there is one for this target (issue 26's acceptance bar), else
    # the random one; drafter-bg never writes here while it trains (wait_drafter swaps).
    if [ -z "$drafter" ]; then
        if drafter_is_current; then drafter=$DRAFTER_TRAINED; else drafter=$MODELS_TRAINED/dflash-r5-for-trained; fi
    fi
    mkdir -p "$OUT" "$work"
    # $OUT/served.json starts as the committed record: a run of some phases adds its rows
    # to all the others, so it can replace the committed one. (Side by side in served-all, the
    # copy comes minutes before any phase writes the record: a second job finds it there.)
    [ -f "$OUT/served.json" ] || [ ! -f tests/gpu/results/served.json ] || cp tests/gpu/results/served.json "$OUT/"
    # Phase records an earlier host returned ($OUT/NAME-raw, staged as .stage/NAME-raw):
    # e.g. the reference, so that this run does only the dflash and stock phases.
    seed_raw "$name-raw" "$work" .json
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$WORK/gpu.txt"
    [ -f "$TRAINED/train-record.json" ] || { echo "train first: remote.sh train-target" >&2; return 1; }
    # SERVED_SETS / SERVED_VLLM_ARGS: more --set items / vLLM arguments for every server,
    # space-separated (e.g. SERVED_VLLM_ARGS=--enforce-eager), recorded in served.json.
    for item in ${SERVED_SETS:-}; do extra+=(--set "$item"); done
    for item in ${SERVED_VLLM_ARGS:-}; do extra+=("--vllm-arg=$item"); done
    # SERVED_EXACT=1: batch-invariant servers without inductor, the numerics the real-shape proofs use.
    [ "${SERVED_EXACT:-0}" = 1 ] && extra+=(--exact-numerics)
    # The conformance phase's prefixes come from z-lab's record (remote.sh zlab-reference), or
    # SERVED_ZLAB's (a committed one, e.g. results/trained/target-*/zlab-reference-*.json)
    local zlab=${SERVED_ZLAB:-$OUT/zlab-reference.json}
    [ -f "$zlab" ] && extra+=(--zlab "$zlab")
    local rc=0
    PYTHONPATH=.:$site "$PY" tests/gpu/runs/served.py --phases "${SERVED_PHASES:-reference,dflash,stock}" \
        --model "$TRAINED" --drafter "$drafter" --site-patched "$patched:$site" --site-stock "$site" \
        --series-hash "$(series_hash "$patched")" --work "$work" --out "$OUT" --gpu "$(cat "$WORK/gpu.txt")" \
        --deadline-s "${SERVED_DEADLINE_S:-540}" --raw-name "$name-raw" --recipe "$recipe" \
        --port-base "${SERVED_PORT_BASE:-8000}" ${SERVED_PARALLEL:+--parallel} "${extra[@]}" \
        ${SERVED_VARIANT:+--variant "$SERVED_VARIANT"} \
        --command "${SERVED_COMMAND:-bash tests/gpu/remote.sh served}" || rc=$?
    # The logs come back whatever served.py did: a failed call is when they are needed.
    tar -C "$work" -czf "$OUT/$name-logs.tar.gz" --exclude=./cwd . || true
    return $rc
}

bench_run() { # the step-time benchmark (tests/gpu/runs/bench_steps.py); results under $OUT
    local t0=$SECONDS budget=${BENCH_BUDGET_S:-525}
    install
    mkdir -p "$OUT" "$WORK/bench"
    patched_site > "$WORK/bench/patch-apply.txt"
    [ -f "$SITE/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so" ] \
        || echo "warning: no _vllm_fa2_C.abi3.so in $SITE: the FA2 runs will fail" >&2
    if [ ! -f "$MODELS/bench/bench-shapes.json" ]; then
        PYTHONPATH=$SITE "$PY" tests/gpu/models/make_bench_checkpoints.py "$MODELS/bench"
    fi
    local extra=()
    [ -n "${BENCH_RUNS:-}" ] && extra+=(--runs "$BENCH_RUNS")
    # Several commands on one host add up to one report (bench_steps.py --keep-earlier)
    [ "${BENCH_KEEP:-1}" = 1 ] && extra+=(--keep-earlier)
    "$PY" tests/gpu/runs/bench_steps.py --models "$MODELS/bench" --site "$SITE_PATCHED:$SITE" \
        --out "$WORK/bench" --deadline-s $((budget - (SECONDS - t0))) --series-hash "$(series_hash)" "${extra[@]}" \
        || echo "bench_steps.py exited $?" >&2
    cp "$WORK/bench/bench.json" "$WORK/bench/bench.md" "$OUT/" 2>/dev/null || true
    # The engines' full records travel in one archive: $OUT brings back at most 8 files
    (cd "$WORK/bench" && tar -czf "$OUT/bench-logs.tar.gz" logs patch-apply.txt run-*.json)
}

MODELS_FULL=${MODELS_FULL:-/tmp/models-full}
FULL_RAW=${FULL_RAW:-$WORK/fullsize-raw}

full_site() { # vLLM 0.21.0, FA2 when staged, and the patched copy the served recipe needs
    install
    extras
    mkdir -p "$OUT" "$WORK" "$FULL_RAW"
    site_is_current "$SITE_PATCHED" || patched_site | tee "$WORK/patch-apply.txt"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$WORK/gpu.txt"
}

full_report() { # fullsize.json / .md from every record on this machine, and the raw records in one archive
    # The GPU line travels inside the archive: the report is made again from the archive alone.
    cp "$WORK/gpu.txt" "$FULL_RAW/gpu.txt"
    "$PY" tests/gpu/reports/fullsize_report.py --shapes "$FULL_RAW/fullsize-shapes.json" --runs "$FULL_RAW" \
        --attempts "$FULL_RAW/attempts" \
        --roofline "$FULL_RAW/roofline.json" --bandwidth "$FULL_RAW/bandwidth.json" \
        --bench-json tests/gpu/results/bench.json --gpu-file "$FULL_RAW/gpu.txt" \
        --json "$OUT/fullsize.json" --md "$OUT/fullsize.md" > /dev/null || echo "fullsize_report.py failed" >&2
    # Whole server logs stay in $FULL_RAW (a DEBUG log can pass the 16 MiB a returned file may have).
    tar -C "$(dirname "$FULL_RAW")" --exclude='*.server.log' -czf "$OUT/fullsize-raw.tar.gz" "$(basename "$FULL_RAW")"
}

full_size_checkpoints() { # issue 27: the full-size checkpoints, the copy bandwidth and the roofline
    full_site
    if [ ! -f "$MODELS_FULL/fullsize-shapes.json" ]; then
        PYTHONPATH=$SITE "$PY" tests/gpu/models/make_fullsize_checkpoints.py "$MODELS_FULL"
    fi
    cp "$MODELS_FULL/fullsize-shapes.json" "$FULL_RAW/"
    PYTHONPATH=$SITE "$PY" tests/gpu/runs/copy_bandwidth.py --json "$FULL_RAW/bandwidth.json"
    "$PY" tests/gpu/reports/roofline.py --target "$MODELS_FULL/gemma4-26b-a4b-nvfp4" \
        --drafter "$MODELS_FULL/dflash-26b-a4b" --context 1024 --json "$FULL_RAW/roofline.json"
    df -h "$MODELS_FULL" | tail -1
    full_report
}

full_launcher() { # the launcher command fullsize_serve.py completes: --test-gpu where the launcher has it
    # (FIT_LAUNCHER replaces it, e.g. to add --force when a preflight check refuses the test GPU)
    [ -n "${FIT_LAUNCHER:-}" ] && { echo "$FIT_LAUNCHER"; return; }
    local sets="--set intent.sampler=pytorch"  # the bundle holds no FlashInfer
    if PYTHONPATH=$(launcher_path) "$PY" -m launcher serve --help 2>/dev/null | grep -q -- '--test-gpu'; then
        echo "$PY -m launcher serve --test-gpu $sets"
    else  # a launcher without --test-gpu (branch served): force past sm_90 and put the FP4 knobs on Marlin
        echo "$PY -m launcher serve --force --set intent.moe_fp4_backend=marlin --set intent.nvfp4_gemm_backend=marlin $sets"
    fi
}

fit() { # one served run in the emulated card's memory: FIT_PROFILE, FIT_DRAFTER (1|0), FIT_CONCURRENCY, FIT_SETS
    local t0=$SECONDS profile=${FIT_PROFILE:-rtx5090} drafter=${FIT_DRAFTER:-1} label
    full_site
    [ -f "$FULL_RAW/fullsize-shapes.json" ] || { echo "run remote.sh full-size-checkpoints first" >&2; return 1; }
    local dargs=(--no-drafter) vargs=(--vllm-arg=--mm-processor-cache-gb --vllm-arg=0) debug=()
    # DEBUG logging gives the worker's activation / non-torch split; speed runs leave it off.
    [ "${FIT_DEBUG_LOG:-1}" = 1 ] && debug=(--debug-log)
    label=$profile-nodrafter
    if [ "$drafter" = 1 ]; then dargs=(--drafter "$MODELS_FULL/dflash-26b-a4b"); label=$profile-dflash; fi
    # A fit-only run (the max_num_seqs level, DEBUG split) keeps its own record beside a speed run's,
    # and so does a run with FIT_SETS (recipe fields changed, e.g. serve.max_model_len=65536).
    [ "${FIT_CONCURRENCY:-max}" = max ] && label=$label-fit
    local sets=() item
    for item in ${FIT_SETS:-}; do sets+=(--set "$item"); done
    [ ${#sets[@]} -gt 0 ] && label=$label-set
    # What sm_12x runs for FLASH_ATTN (the drafter's backend), when FA2 travelled in extras.
    if [ -f "$SITE/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so" ]; then
        vargs+=(--vllm-arg=--attention-config '--vllm-arg={"flash_attn_version": 2}')
    fi
    PYTHONPATH=.:$SITE_PATCHED:$SITE "$PY" tests/gpu/runs/fullsize_serve.py --label "$label" --out "$FULL_RAW" \
        --profile "$profile" --recipe "${FIT_RECIPE:-gemma4-moe-dflash}" --launcher "$(full_launcher)" \
        --series-hash "$(series_hash)" \
        --model "$MODELS_FULL/gemma4-26b-a4b-nvfp4" "${dargs[@]}" "${sets[@]}" --concurrency "${FIT_CONCURRENCY:-max}" \
        "${vargs[@]}" "${debug[@]}" --deadline-s $(( ${FIT_BUDGET_S:-555} - (SECONDS - t0) )) \
        || echo "fullsize_serve.py exited $?" >&2
    full_report
}

speedup_sites() { # speedup_sites VERSION: "SITE PATCHED" of that release, installed and patched (prepare)
    prepare >&2
    if [ "$1" = "$V33" ]; then echo "$SITE33 $SITE33_PATCHED"; else echo "$SITE $SITE_PATCHED"; fi
}

speedup_vllm_args() { # speedup_vllm_args SITE: fit's vLLM arguments for the full-size servers, one a line
    echo "--vllm-arg=--mm-processor-cache-gb"; echo "--vllm-arg=0"
    if [ -f "$1/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so" ]; then
        echo "--vllm-arg=--attention-config"; echo '--vllm-arg={"flash_attn_version": 2}'
    fi
}

speedup_commit() { # speedup_commit FILE MESSAGE: commit FILE alone where this checkout has git
    if git rev-parse --git-dir >/dev/null 2>&1; then
        git add "$1" && git commit -m "$2" -- "$1" || true
    else
        echo "no git here: commit $1 where the checkout has git before the next step" >&2
    fi
}

speedup_frozen() { # issue 53: the frozen step-time model's inputs (speedup_frozen.py) on vLLM 0.33.0 at full
    # size, rtx5090 profile: decode, verify and draft at K 3/7/15, concurrency 1 and 4. Resumable
    # (SPEEDUP_BUDGET_S a command); once whole, results/speedup-frozen.json, committed where git is.
    # SPEEDUP_SET=KEY=VALUE: one more --set for every server (the record says so).
    local t0=$SECONDS v=${SPEEDUP_VLLM:-$V33} site patched rc=0 vargs
    read -r site patched < <(speedup_sites "$v")
    [ -f "$MODELS_FULL/fullsize-shapes.json" ] || { echo "run remote.sh full-size-checkpoints first" >&2; return 1; }
    mkdir -p "$OUT" "$WORK/speedup-frozen"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$WORK/gpu.txt"
    mapfile -t vargs < <(speedup_vllm_args "$site")
    PYTHONPATH=.:$patched:$site "$PY" tests/gpu/runs/speedup_frozen.py --out "$WORK/speedup-frozen" \
        --json "$OUT/speedup-frozen.json" --model "$MODELS_FULL/gemma4-26b-a4b-nvfp4" \
        --drafter "$MODELS_FULL/dflash-26b-a4b" --launcher "$(full_launcher)" --series-hash "$(series_hash "$patched")" \
        --vllm "$v" --gpu-file "$WORK/gpu.txt" ${SPEEDUP_GPUS:+--gpus "$SPEEDUP_GPUS"} "${vargs[@]}" \
        ${SPEEDUP_SET:+--set "$SPEEDUP_SET"} --deadline-s $(( ${SPEEDUP_BUDGET_S:-3600} - (SECONDS - t0) )) || rc=$?
    tar -C "$WORK" --exclude='*.server.log' -czf "$OUT/speedup-frozen-raw.tar.gz" speedup-frozen
    [ "$rc" = 0 ] || return "$rc"
    cp "$OUT/speedup-frozen.json" tests/gpu/results/speedup-frozen.json
    speedup_commit tests/gpu/results/speedup-frozen.json "speedup-frozen.json: the step-time model's inputs, vLLM $v"
}

speedup_curve() { # issue 53: the speed-up curve's pending batches of SPEEDUP_VLLM (0.33.0, then 0.21.0) on
    # the full-size checkpoint (speedup_curve.py), a lane a GPU of SPEEDUP_GPUS (default 0); each
    # lane saves its record and its references in $OUT as it goes.
    #   SPEEDUP_BUDGET_S: the time the run may take, 120 s of it for stopping and packing: no
    #     server or point starts without its time, and the run stops between points (exit 3: run
    #     again; `speedup_curve.py merge` puts lane records brought back into the curve)
    #   SPEEDUP_BATCHES=N: stop after N batches; SPEEDUP_ONLY=ID,ID: only those points (a pilot:
    #     does acceptance follow the plan before the grid's hour is spent?)
    #   SPEEDUP_REFS_FROM=nodrafter: references from the server without the drafter, not from a
    #     DFlash server at each K
    #   SPEEDUP_PORT: the first lane's port (default 8021, a lane 10 more than the one before):
    #     both releases at once, one a GPU, need two (BG_NAME=... bg speedup-curve for the second)
    # References that came back ($OUT/speedup-refs.tar.gz, speedup-curve-lane-I-refs.tar.gz),
    # staged in .stage/, are used again.
    local t0=$SECONDS v=${SPEEDUP_VLLM:-$V33} site patched vargs rc=0 b
    [ -f tests/gpu/results/speedup-frozen.json ] || { echo "run remote.sh speedup-frozen first" >&2; return 1; }
    read -r site patched < <(speedup_sites "$v")
    [ -f "$MODELS_FULL/fullsize-shapes.json" ] || { echo "run remote.sh full-size-checkpoints first" >&2; return 1; }
    mkdir -p "$OUT" "$WORK/speedup" "$WORK/speedup-refs"
    local f
    for f in "$BUNDLE_DIR"/speedup-refs.tar.gz "$BUNDLE_DIR"/speedup-curve-lane-*-refs.tar.gz; do
        if [ -f "$f" ]; then tar -C "$WORK" --skip-old-files -xzf "$f"; fi
    done
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$WORK/gpu.txt"
    mapfile -t vargs < <(speedup_vllm_args "$site")
    PYTHONPATH=.:$patched:$site "$PY" tests/gpu/runs/speedup_curve.py run --vllm "$v" --commit \
        --series-hash "$(series_hash "$patched")" --gpu-file "$WORK/gpu.txt" \
        --model "$MODELS_FULL/gemma4-26b-a4b-nvfp4" --drafter "$MODELS_FULL/dflash-26b-a4b" \
        --launcher "$(full_launcher)" --refs "$WORK/speedup-refs" --work "$WORK/speedup" \
        --batches "${SPEEDUP_BATCHES:-0}" --gpus "${SPEEDUP_GPUS:-0}" --lane-dir "$OUT" "${vargs[@]}" \
        ${SPEEDUP_ONLY:+--only "$SPEEDUP_ONLY"} ${SPEEDUP_REFS_FROM:+--refs-from "$SPEEDUP_REFS_FROM"} \
        ${SPEEDUP_PORT:+--port "$SPEEDUP_PORT"} \
        ${SPEEDUP_BUDGET_S:+--deadline-s $(( (b = SPEEDUP_BUDGET_S - (SECONDS - t0) - 120) > 1 ? b : 1 ))} || rc=$?
    [ "$rc" = 0 ] || echo "speedup_curve.py exited $rc" >&2
    cp tests/gpu/results/speedup-curve.json "$OUT/" 2>/dev/null || true
    tar -C "$WORK" -czf "$OUT/speedup-refs.tar.gz" speedup-refs
    # beside the curve too: its page says what the references hold (speedup_report.reference_sets)
    local gpu
    gpu=$(gpu_slug)
    mkdir -p tests/gpu/results/speedup-curve
    cp "$OUT/speedup-refs.tar.gz" "tests/gpu/results/speedup-curve/refs-v$v-$(date -u +%F)-$gpu.tar.gz"
    return "$rc"
}

speedup_oracle_cost() { # issue 53: oracle_cost.py on SPEEDUP_VLLM (default 0.33.0): the real drafter and
    # the oracle at a planned 1.0 timed in turn on one DFlash server at ORACLE_COST_K (15) and
    # ORACLE_COST_C (4), ORACLE_COST_ROUNDS (3) times, the oracle with each of ORACLE_COST_TAILS
    # (reference,drafter: its tokens past the first wrong one); the record in
    # tests/gpu/results/speedup-oracle-cost.json (the curve's page shows it) and in $OUT.
    # One GPU (CUDA_VISIBLE_DEVICES); SPEEDUP_PORT and SPEEDUP_BUDGET_S as speedup-curve's.
    local t0=$SECONDS v=${SPEEDUP_VLLM:-$V33} site patched vargs rc=0 b
    read -r site patched < <(speedup_sites "$v")
    [ -f "$MODELS_FULL/fullsize-shapes.json" ] || { echo "run remote.sh full-size-checkpoints first" >&2; return 1; }
    mkdir -p "$OUT" "$WORK/oracle-cost" "$WORK/speedup-refs"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$WORK/gpu-oracle-cost.txt"
    mapfile -t vargs < <(speedup_vllm_args "$site")
    PYTHONPATH=.:$patched:$site "$PY" tests/gpu/runs/oracle_cost.py --vllm "$v" \
        --series-hash "$(series_hash "$patched")" --gpu-file "$WORK/gpu-oracle-cost.txt" \
        --model "$MODELS_FULL/gemma4-26b-a4b-nvfp4" --drafter "$MODELS_FULL/dflash-26b-a4b" \
        --launcher "$(full_launcher)" --refs "$WORK/speedup-refs" --work "$WORK/oracle-cost" \
        --k "${ORACLE_COST_K:-15}" --concurrency "${ORACLE_COST_C:-4}" --rounds "${ORACLE_COST_ROUNDS:-3}" \
        ${ORACLE_COST_TAILS:+--tails "$ORACLE_COST_TAILS"} \
        --record tests/gpu/results/speedup-oracle-cost.json --port "${SPEEDUP_PORT:-8051}" "${vargs[@]}" \
        ${SPEEDUP_BUDGET_S:+--deadline-s $(( (b = SPEEDUP_BUDGET_S - (SECONDS - t0) - 60) > 1 ? b : 1 ))} || rc=$?
    [ "$rc" = 0 ] || echo "oracle_cost.py exited $rc" >&2
    cp tests/gpu/results/speedup-oracle-cost.json "$OUT/" 2>/dev/null || true
    return "$rc"
}

evidence() { # evidence ARGS..: tests/gpu/reports/evidence.py run ARGS on this host's Python, for a GPU
    # host without network (`make gpu-PAGE WHERE=gpu,cpu`, which makes no venv there: pip would need
    # the network). The merges' one import the host lacks, unidiff, comes from the bundles as their
    # installs link it (host_deps): its folder is on PYTHONPATH before it is filled.
    case ":${PYTHONPATH:-}:" in *":$WORK/host-deps:"*) ;; *) export PYTHONPATH="$WORK/host-deps${PYTHONPATH:+:$PYTHONPATH}" ;; esac
    "$PY" tests/gpu/reports/evidence.py run "$@"
}

cmd=${1:-}
shift || true
host_deps  # a bundle installed by an earlier verb on this machine
case "$cmd" in
    receive) receive ;;
    install) install ;;
    extras) extras ;;
    proof) proof "$@" ;;
    realshape) realshape ;;
    realshape-v33) realshape_v33 ;;
    realshape-v33-trained) realshape_v33_trained ;;
    bench) bench_run ;;
    stability) stability ;;
    quantize-rs) quantize_rs ;;
    train-target) train_target ;;
    train-drafter) train_drafter ;;
    pack-trained) pack_trained ;;
    target-bg) target_background ;;
    receive-trained) receive_trained ;;
    engine-check) engine_check ;;
    multinode-bg) multinode_background ;;
    multinode-wait) multinode_wait ;;
    target-wait) target_wait ;;
    zlab-reference) zlab_reference ;;
    fast-decode-check) corpus_receive && mkdir -p "$OUT" && PYTHONPATH="$SITE_TRAIN" "$PY" tests/gpu/models/fast_decode_check.py "$OUT/fast-decode-check.json" ;;
    check-trained) trained_identity_check ;;
    realshape-trained) realshape_trained ;;
    full-size-checkpoints) full_size_checkpoints ;;
    fit) fit ;;
    speedup-frozen) speedup_frozen ;;
    speedup-curve) speedup_curve ;;
    speedup-oracle-cost) speedup_oracle_cost ;;
    full-bench) FIT_CONCURRENCY=${FIT_CONCURRENCY:-1,4,16,max} FIT_DEBUG_LOG=${FIT_DEBUG_LOG:-0} fit ;;
    served) served ;;
    served-all) served_all ;;
    served-run) served_run "$@" ;;
    prepare) prepare ;;
    drafter-bg) drafter_background ;;
    drafter-sweep) drafter_sweep ;;
    sweep-wait) sweep_wait ;;
    pack-drafter) pack_drafter ;;
    nvfp4-reference) nvfp4_reference ;;
    lanes-bg) lanes_background ;;
    lanes-wait) lanes_wait ;;
    bg) background_verb "$@" ;;
    bg-wait) background_wait "$@" ;;
    evidence) evidence "$@" ;;
    archive-lanes) archive_lanes ;;
    *) echo "usage: $0 receive|install|extras|proof [stock] [patched]|realshape|realshape-v33|bench|stability|quantize-rs|train-target|train-drafter|pack-trained|check-trained|realshape-trained|realshape-v33-trained|full-size-checkpoints|fit|full-bench|served|served-all|prepare|drafter-bg|pack-drafter|lanes-bg|lanes-wait|nvfp4-reference|drafter-sweep|sweep-wait|target-bg|receive-trained|engine-check|multinode-bg|multinode-wait|target-wait|fast-decode-check|zlab-reference|speedup-frozen|speedup-curve|speedup-oracle-cost|served-run SITE PATCHED NAME|bg VERB|bg-wait VERB|evidence [--where SIDES] PAGE..|archive-lanes" >&2; exit 2 ;;
esac
