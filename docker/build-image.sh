#!/usr/bin/env bash
# Build the images of the matrix {0.21.0, 0.33.0 from source; every release with a series as an overlay} x {sm120 amd64, sm121 arm64}.
#
#   docker/build-image.sh source|overlay VLLM_VERSION TARGET [docker build args...]
#   docker/build-image.sh classic-dockerfile   # print docker/Dockerfile as the classic builder gets it
#
#   VLLM_VERSION  source: 0.21.0 | 0.33.0; overlay: any release with a series (0.32.0 ...) | all
#                 (overlay with BASE: auto, or the version BASE must have)
#   TARGET        sm120 (RTX 5090, amd64) | sm121 (DGX Spark, arm64) | all
#                 (linux-amd64 / linux-arm64, the `launcher build` names, work too)
#   env IMAGE_REPO  image name without tag (default vllm-sm12x)
#   env BASE        overlay only: the image with vLLM to patch, e.g. nvcr.io/nvidia/vllm:26.09-py3
#                   (default: the upstream release image vllm/vllm-openai:vVERSION)
#   env PYTHON      a Python with the launcher installed (default .venv/bin/python)
#
# Tags say version, base and target: vllm-sm12x:0.21.0-sm120-amd64 (source),
# vllm-sm12x:0.33.0-sm120-amd64-overlay (on vllm/vllm-openai),
# vllm-sm12x:0.29.0-ngc26.09-sm121-arm64-overlay (on NGC). An overlay's inputs
# (base digest, vLLM, torch, FlashInfer, series hash) are read off the base
# first (`launcher image inputs`) and become labels. With buildx the build uses BuildKit
# (cache mounts, --platform for the other arch through QEMU); without it the
# classic builder runs, and the source Dockerfile's BuildKit-only cache mounts
# are stripped first (same steps, no caches).
set -euo pipefail

cd "$(dirname "$0")/.."
usage() { sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

# `RUN --mount=... \` continuation lines and inline --mount flags -> nothing.
strip_buildkit() {
    sed -E -e '/^[[:space:]]*--mount=[^[:space:]]+[[:space:]]*\\$/d' -e 's/--mount=[^[:space:]]+[[:space:]]*//g' "$1"
}

if [ "${1:-}" = classic-dockerfile ]; then
    strip_buildkit docker/Dockerfile
    exit 0
fi
[ $# -ge 3 ] || usage
flavor=$1 versions=$2 targets=$3
shift 3
extra=("$@")  # passed on to docker build
[ "$flavor" = source ] || [ "$flavor" = overlay ] || usage
if [ "$versions" = all ]; then
    versions=$("$PYTHON" -c 'from launcher.patching.series import available_versions; print(*available_versions())')
fi
if [ "$versions" = auto ] && { [ "$flavor" != overlay ] || [ -z "${BASE:-}" ]; }; then
    echo "VLLM_VERSION=auto needs an overlay on BASE=<image with vLLM>" >&2
    exit 2
fi
[ "$targets" = all ] && targets="sm120 sm121"
IMAGE_REPO=${IMAGE_REPO:-vllm-sm12x}
PYTHON=${PYTHON:-.venv/bin/python}

arch_of() {
    case "$1" in
        sm120 | linux-amd64) echo amd64 ;;
        sm121 | linux-arm64) echo arm64 ;;
        *) echo "unknown TARGET '$1': sm120 (amd64) or sm121 (arm64)" >&2; exit 2 ;;
    esac
}
sm_of() { case "$1" in linux-amd64) echo sm120 ;; linux-arm64) echo sm121 ;; *) echo "$1" ;; esac; }

host_arch() { case "$(uname -m)" in x86_64) echo amd64 ;; aarch64 | arm64) echo arm64 ;; *) uname -m ;; esac; }

have_buildx() { docker buildx version >/dev/null 2>&1; }

series_hash() {
    "$PYTHON" -c 'import sys; from launcher.patching.series import series_for; print(series_for(sys.argv[1]).hash)' "$1"
}

# Overlay: build args and tag from the base itself (digest, vLLM, torch, FlashInfer, series).
overlay_inputs() {
    local version=$1 target=$2 base inputs line
    base=${BASE:-vllm/vllm-openai:v$version}
    inputs=$("$PYTHON" -m launcher image inputs --base "$base" --target "$target" --repo "$IMAGE_REPO")
    while IFS= read -r line; do
        case "$line" in
            TAG=*) tag=${line#TAG=} ;;
            VLLM_VERSION=*)
                if [ "$version" != auto ] && [ "${line#VLLM_VERSION=}" != "$version" ]; then
                    echo "$base has vLLM ${line#VLLM_VERSION=}, not $version (VLLM_VERSION=auto takes what it has)" >&2
                    exit 1
                fi
                args+=(--build-arg "$line") ;;
            *=*) args+=(--build-arg "$line") ;;
        esac
    done <<<"$inputs"
}

build_one() {
    local version=$1 target arch tag dockerfile args=()
    target=$(sm_of "$2")
    arch=$(arch_of "$target")
    if [ "$flavor" = overlay ]; then
        dockerfile=docker/Dockerfile.overlay
        overlay_inputs "$version" "$target"
    else
        dockerfile=docker/Dockerfile
        tag="$IMAGE_REPO:$version-$target-$arch"
        args=(--build-arg "VLLM_VERSION=$version" --build-arg "TARGET=$target" --build-arg "ARCH=$arch"
              --build-arg "SERIES_HASH=$(series_hash "$version")")
    fi
    args+=(-t "$tag")
    echo "building $tag ($dockerfile)" >&2
    if have_buildx; then
        docker buildx build --load --platform "linux/$arch" -f "$dockerfile" "${args[@]}" "${extra[@]}" .
    else
        if [ "$arch" != "$(host_arch)" ]; then
            echo "building the $arch image on $(host_arch) needs docker buildx (and QEMU binfmt)" >&2
            exit 1
        fi
        if [ "$flavor" = source ]; then
            # The classic builder has no RUN --mount: drop the cache mounts.
            local stripped
            stripped=$(mktemp)
            strip_buildkit "$dockerfile" >"$stripped"
            DOCKER_BUILDKIT=0 docker build -f "$stripped" "${args[@]}" "${extra[@]}" .
            rm -f "$stripped"
        else
            DOCKER_BUILDKIT=0 docker build -f "$dockerfile" "${args[@]}" "${extra[@]}" .
        fi
    fi
    echo "built $tag" >&2
}


for version in $versions; do
    for target in $targets; do
        build_one "$version" "$target"
    done
done
