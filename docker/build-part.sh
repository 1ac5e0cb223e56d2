#!/usr/bin/env bash
# Build one part of the image's wheels with the same code path as a native
# build: `launcher build wheels --only flashinfer|vllm` (the series is applied
# to the sdist before anything compiles; arch lists come from
# build/targets.yaml). Usage: build-part.sh flashinfer|vllm  (env: TARGET, VLLM_VERSION)
set -euo pipefail
part="${1:?usage: build-part.sh flashinfer|vllm}"
case "${TARGET:?}" in
  sm120) build_target=linux-amd64; machine=x86_64 ;;
  sm121) build_target=linux-arm64; machine=aarch64 ;;
  *) echo "TARGET must be sm120 (amd64) or sm121 (arm64), not '${TARGET}'" >&2; exit 2 ;;
esac
if [ "$(uname -m)" != "${machine}" ]; then
  echo "TARGET ${TARGET} builds on ${machine}; this build runs on $(uname -m) (pass --platform)" >&2
  exit 2
fi
launcher build plan --target "${build_target}" --vllm-version "${VLLM_VERSION:?}"
exec launcher build wheels --target "${build_target}" --vllm-version "${VLLM_VERSION}" \
  --only "${part}" --work-dir "/build/${part}" --output-dir "/wheels/${part}"
