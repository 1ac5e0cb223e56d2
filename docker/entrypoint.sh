#!/bin/sh
# Image entrypoint: the launcher's commands, and vLLM's own arguments the way
# vllm/vllm-openai takes them (its ENTRYPOINT is `vllm serve`).
#
#   docker run IMAGE serve --recipe gemma4-moe-dflash   -> launcher serve --host 0.0.0.0 ... (native,
#                                                          inside; models from /models)
#   docker run IMAGE doctor | patch status | ...        -> launcher <command> ...
#   docker run IMAGE --model /models/x --max-model-len 8192
#   docker run IMAGE google/gemma-4-26B-A4B-it ...      -> the series preflight (printed, never
#                                                          blocking), then vllm serve <args>
#   docker run IMAGE vllm serve /models/... --port 8000 -> vllm serve ... (what `launcher serve
#                                                          --runtime docker` sends: an argv already
#                                                          resolved on the host)
#   docker run IMAGE                                    -> launcher --help
# POSIX sh on purpose: the test images are busybox-based.
set -e

# The documented mount point (docker run -v ~/models:/models), whatever the user's home.
export MODELS_DIR="${MODELS_DIR:-/models}"

# NGC bases (nvcr.io/nvidia/vllm) set up CUDA forward compatibility and print
# their banner in their own entrypoint: go through it once, as the base would.
if [ -z "${VLLM_SM12X_BASE_ENTRYPOINT_DONE:-}" ] && [ -x /opt/nvidia/nvidia_entrypoint.sh ]; then
    export VLLM_SM12X_BASE_ENTRYPOINT_DONE=1
    exec /opt/nvidia/nvidia_entrypoint.sh "$0" "$@"
fi

# Top-level launcher commands, written at image build time
# (launcher image write-manifest); the list below covers an image without it.
COMMANDS_FILE=/etc/vllm-sm12x/launcher-commands
is_launcher_command() {
    if [ -f "$COMMANDS_FILE" ]; then
        grep -qxF -- "$1" "$COMMANDS_FILE"
        return
    fi
    case "$1" in
        serve | doctor | version | install | recipes | patch | build | quantize | image | ps | stop | models | bench) return 0 ;;
        *) return 1 ;;
    esac
}

case "${1:-}" in
    "" | -h | --help)
        echo "vLLM arguments without a launcher command go to vllm serve (docker run IMAGE --model /models/x ...);"
        echo "docker run IMAGE vllm serve --help lists them. The launcher's commands:"
        exec launcher --help
        ;;
    vllm | python | python3 | sh | bash) exec "$@" ;;
    /*) exec "$@" ;;  # an absolute path runs as is
    serve)
        # Inside the container's own network namespace the server must listen on
        # every interface to be reachable through `docker run -p`; who can reach
        # it is decided there (-p 127.0.0.1:8000:8000). A --host given by the
        # user comes later on the command line and wins.
        shift
        exec launcher serve --host 0.0.0.0 "$@"
        ;;
esac

if is_launcher_command "$1"; then
    exec launcher "$@"
fi

# Anything else is vLLM's: print what runs (vLLM, the series, the GPU) and
# start it. The preflight never blocks here: the user asked for vLLM itself.
launcher image preflight -- "$@" || echo "vllm-sm12x: preflight failed (exit $?); starting vllm serve anyway" >&2
exec vllm serve "$@"
