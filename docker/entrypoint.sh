#!/bin/sh
# Image entrypoint: the launcher, with a pass-through for vLLM itself.
#
#   docker run IMAGE serve --recipe gemma4-moe-dflash   -> launcher serve ... (native, inside)
#   docker run IMAGE vllm serve /models/... --port 8000 -> vllm serve ... (what `launcher serve
#                                                          --runtime docker` sends: an argv already
#                                                          resolved on the host)
#   docker run IMAGE                                    -> launcher --help
# POSIX sh on purpose: the test images are busybox-based.
set -e
case "${1:-}" in
    "") exec launcher --help ;;
    vllm | python | python3 | sh | bash) exec "$@" ;;
    -*) exec launcher "$@" ;;
    *)
        # An absolute path runs as is; anything else is a launcher command.
        if [ "${1#/}" != "$1" ]; then exec "$@"; fi
        exec launcher "$@"
        ;;
esac
