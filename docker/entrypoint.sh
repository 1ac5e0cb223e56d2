#!/bin/sh
# Image entrypoint: the launcher, with a pass-through for vLLM itself.
#
#   docker run IMAGE serve --recipe gemma4-moe-dflash   -> launcher serve --host 0.0.0.0 ... (native,
#                                                          inside; models from /models)
#   docker run IMAGE vllm serve /models/... --port 8000 -> vllm serve ... (what `launcher serve
#                                                          --runtime docker` sends: an argv already
#                                                          resolved on the host)
#   docker run IMAGE                                    -> launcher --help
# POSIX sh on purpose: the test images are busybox-based.
set -e

# The documented mount point (docker run -v ~/models:/models), whatever the user's home.
export MODELS_DIR="${MODELS_DIR:-/models}"

case "${1:-}" in
    "") exec launcher --help ;;
    vllm | python | python3 | sh | bash) exec "$@" ;;
    serve)
        # Inside the container's own network namespace the server must listen on
        # every interface to be reachable through `docker run -p`; who can reach
        # it is decided there (-p 127.0.0.1:8000:8000). A --host given by the
        # user comes later on the command line and wins.
        shift
        exec launcher serve --host 0.0.0.0 "$@"
        ;;
    -*) exec launcher "$@" ;;
    *)
        # An absolute path runs as is; anything else is a launcher command.
        if [ "${1#/}" != "$1" ]; then exec "$@"; fi
        exec launcher "$@"
        ;;
esac
