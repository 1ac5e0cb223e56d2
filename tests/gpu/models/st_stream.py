"""Write a safetensors file one tensor at a time (pure Python, no torch).

``safetensors.torch.save_file`` takes a dict of every tensor of the file and
copies each into bytes before writing, so a shard costs twice its size in
host memory. The full-size checkpoint (18.8 GB) is written on the GPU host
from tensors drawn one at a time, so the header is laid out first from the
tensor list (names, dtypes, shapes are known before any value is) and the
values follow in that order, each dropped once written.

Format (github.com/huggingface/safetensors, "Format"): 8 bytes little-endian
header length N, N bytes of JSON ``{name: {"dtype", "shape", "data_offsets":
[begin, end]}, "__metadata__": {...}}`` with offsets relative to the end of
the header, then the data, contiguous and in offset order. The header is
padded with spaces to a multiple of 8 so every tensor starts aligned.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1,
               "I16": 2, "I32": 4, "I64": 8, "BOOL": 1}


def header(specs: list[tuple[str, str, list[int]]], metadata: dict[str, str] | None = None) -> tuple[bytes, int]:
    """(the 8-byte length and padded JSON header, bytes of data) for tensors written in ``specs`` order."""
    entries: dict = {}
    offset = 0
    for name, dtype, shape in specs:
        if name in entries or name == "__metadata__":
            raise ValueError(f"tensor name {name!r} repeats or is reserved")
        size = DTYPE_BYTES[dtype] * math.prod(shape)
        entries[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    if metadata:
        entries = {"__metadata__": dict(metadata), **entries}
    text = json.dumps(entries, separators=(",", ":")).encode("utf-8")
    text += b" " * (-(8 + len(text)) % 8)
    return struct.pack("<Q", len(text)) + text, offset


class Writer:
    """``with Writer(path, specs) as w: w.write(name, buffer)`` in ``specs`` order.

    ``buffer`` is anything with the buffer protocol (bytes, a numpy array, a
    memoryview); its byte length must be the spec's. The file is written under
    a temporary name and renamed when every tensor arrived, so a cut run
    leaves no file that looks complete.
    """

    def __init__(self, path: Path, specs: list[tuple[str, str, list[int]]], metadata: dict[str, str] | None = None):
        self.path = Path(path)
        self.specs = list(specs)
        head, self.data_bytes = header(self.specs, metadata)
        self._tmp = self.path.with_name(self.path.name + ".partial")
        self._f = open(self._tmp, "wb")
        self._f.write(head)
        self._next = 0

    def write(self, name: str, buffer) -> None:
        if self._next >= len(self.specs):
            raise ValueError(f"{self.path.name}: {name} is one tensor more than the header holds")
        want, dtype, shape = self.specs[self._next]
        if name != want:
            raise ValueError(f"{self.path.name}: got {name}, the header's next tensor is {want}")
        view = memoryview(buffer).cast("B")
        size = DTYPE_BYTES[dtype] * math.prod(shape)
        if view.nbytes != size:
            raise ValueError(f"{name}: {view.nbytes} bytes for {dtype} {shape} ({size} bytes)")
        self._f.write(view)
        self._next += 1

    def close(self) -> None:
        self._f.close()
        if self._next != len(self.specs):
            missing = [n for n, _, _ in self.specs[self._next:]][:3]
            raise ValueError(f"{self.path.name}: closed with {len(self.specs) - self._next} tensors unwritten "
                             f"({missing}...)")
        self._tmp.replace(self.path)

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        if kind is None:
            self.close()
        else:
            self._f.close()
            self._tmp.unlink(missing_ok=True)
        return False


def read_header(path: Path) -> dict:
    """name -> {dtype, shape, data_offsets} of one safetensors file (``__metadata__`` dropped)."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        entries = json.loads(f.read(length))
    entries.pop("__metadata__", None)
    return entries


def read_checkpoint_tensors(folder: Path) -> dict[str, tuple[str, list[int]]]:
    """name -> (dtype, shape) over every ``*.safetensors`` file of a checkpoint folder, from headers only."""
    out: dict[str, tuple[str, list[int]]] = {}
    for path in sorted(Path(folder).glob("*.safetensors")):
        for name, meta in read_header(path).items():
            out[name] = (meta["dtype"], list(meta["shape"]))
    return out
