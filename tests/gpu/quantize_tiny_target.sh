#!/usr/bin/env bash
# Quantize the GPU harness's tiny Gemma 4 targets to ModelOpt NVFP4, here on the CPU,
# so the GPU proof can serve NVFP4 + DFlash (issue 7). A GPU host without network may
# lack nvidia-modelopt: quantize here, copy the result there.
#
# Usage: bash tests/gpu/quantize_tiny_target.sh CHECKPOINTS_DIR
#   CHECKPOINTS_DIR is what `python tests/gpu/models/make_checkpoints.py CHECKPOINTS_DIR` wrote
#   (run here first when it holds no shapes.json). For every target T it writes
#   CHECKPOINTS_DIR/T-nvfp4 (random calibration ids: the tiny targets have no tokenizer),
#   then checks each drafter against its target's NVFP4 copy with launcher.checkpoint,
#   and exits non-zero if anything would block a start.
# Needs the quantize extra in the venv ($VENV, default .venv): make venv installs it.
set -euo pipefail

repo="$(cd "$(dirname "$0")/../.." && pwd)"
venv="${VENV:-$repo/.venv}"
out="${1:?usage: quantize_tiny_target.sh CHECKPOINTS_DIR}"

if [[ ! -f "$out/shapes.json" ]]; then
    "$venv/bin/python" "$repo/tests/gpu/models/make_checkpoints.py" "$out"
fi

targets="$("$venv/bin/python" -c 'import json, sys
print(" ".join(t["name"] for t in json.load(open(sys.argv[1]))["targets"]))' "$out/shapes.json")"

for target in $targets; do
    "$venv/bin/launcher" quantize --model "$out/$target" --out "$out/$target-nvfp4" \
        --device cpu --calib-samples 8 --calib-seq-len 64 --force
done

"$venv/bin/python" - "$out" <<'PY'
import json
import sys
from pathlib import Path

from launcher.checkpoint import inspect_drafter, inspect_target

root = Path(sys.argv[1])
shapes = json.loads((root / "shapes.json").read_text())
failed = False
for drafter in shapes["drafters"]:
    target_dir = root / f"{drafter['target']}-nvfp4"
    info, reasons = inspect_target(target_dir, expected_format="modelopt-nvfp4", vllm_version="0.21.0")
    reasons += inspect_drafter(root / drafter["name"], target=info)
    print(f"{target_dir.name} + {drafter['name']}: {info.summary()}")
    for reason in reasons:
        print("  " + reason.line())
        failed |= reason.blocking
sys.exit(1 if failed else 0)
PY
