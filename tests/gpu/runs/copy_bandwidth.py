"""The device's memory bandwidth, measured: a device-to-device copy and a read-only reduction (a few seconds).

The roofline's achieved fraction divides the decode's bytes per second by a
bandwidth measured on the same GPU, not by the datasheet's. Two numbers:

* ``copy_gbps``: ``dst.copy_(src)`` of a 2 GiB buffer; it reads and writes
  every byte, so bytes moved = 2 x size (the STREAM convention);
* ``read_gbps``: ``src.sum(dtype=float32)`` over a bf16 buffer, which reads
  every byte once and writes nothing worth counting (decode is read-bound,
  so this is the closer analogue).

Each is the median of ``--repeats`` timed runs (CUDA events) after warm-up.
Decimal GB/s (1e9 bytes), as datasheets state bandwidth. Prints one JSON
line and writes it to ``--json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


def measure(size_bytes: int, repeats: int) -> dict:
    import torch

    dev = torch.device("cuda")
    src = torch.empty(size_bytes // 2, dtype=torch.bfloat16, device=dev).normal_()
    dst = torch.empty_like(src)

    def timed(fn) -> float:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1000.0)
        return statistics.median(times)

    copy_s = timed(lambda: dst.copy_(src))
    read_s = timed(lambda: src.sum(dtype=torch.float32))
    props = torch.cuda.get_device_properties(dev)
    _, total = torch.cuda.mem_get_info(dev)
    return {"device": props.name, "total_memory_bytes": total, "buffer_bytes": size_bytes, "repeats": repeats,
            "copy_gbps": round(2 * size_bytes / copy_s / 1e9, 1), "read_gbps": round(size_bytes / read_s / 1e9, 1),
            "torch": torch.__version__}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=2.0, help="buffer size")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    result = measure(int(args.gib * (1 << 30)), args.repeats)
    line = json.dumps(result)
    print(line)
    if args.json:
        args.json.write_text(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
