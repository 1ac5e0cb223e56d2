"""Hold GPU memory so that exactly ``--leave-free`` bytes stay free, until terminated (memfit.py says why).

Prints one JSON line after start-up (``cudaMemGetInfo`` free and total with
this process's own CUDA context already counted) and one after the
allocation, then sleeps until SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gpu_paths  # noqa: E402,F401  (every folder of the harness on sys.path)

import memfit  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leave-free", type=int, required=True, help="bytes to leave free")
    args = parser.parse_args(argv)
    import torch

    torch.cuda.init()
    free, total = torch.cuda.mem_get_info()
    print(json.dumps({"event": "start", "free": free, "total": total,
                      "device": torch.cuda.get_device_name()}), flush=True)
    size = max(0, (free - args.leave_free) // memfit.BLOCK * memfit.BLOCK)
    held = torch.empty(size, dtype=torch.uint8, device="cuda") if size else None
    torch.cuda.synchronize()
    free_after, _ = torch.cuda.mem_get_info()
    print(json.dumps({"event": "holding", "held": size, "free": free_after, "total": total}), flush=True)
    stop = False

    def _stop(*_):
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    while not stop:
        time.sleep(0.5)
    del held
    return 0


if __name__ == "__main__":
    sys.exit(main())
