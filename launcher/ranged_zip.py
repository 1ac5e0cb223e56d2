"""Some members of a remote zip (a wheel), read with HTTP range requests.

A vLLM wheel is about 300 MB, of which the Python files and metadata the
patch checks read are about 10 MB, stored in a handful of runs between the
compiled extensions. Reading the zip's central directory from the end of the
file, then only the byte runs that hold the wanted members, costs a dozen
requests and a thirtieth of the download. The pieces go into a sparse local
file of the wheel's full size, so the standard ``zipfile`` reads it as the
whole wheel and checks every extracted member's CRC-32.

What a ranged read cannot do is check the wheel's sha256 from the index
(that needs every byte): the members are as trustworthy as the HTTPS
connection to the index's file host, and checked against transfer errors by
their CRC. A server that ignores ranges, or a zip this does not handle
(ZIP64), raises ``RangesUnsupported`` and the caller downloads the file.
"""

from __future__ import annotations

import functools
import ssl
import struct
import urllib.request
import zipfile
from collections.abc import Callable
from pathlib import Path

_EOCD = b"PK\x05\x06"
_TAIL = 1 << 16  # the end-of-central-directory record plus a comment fits
_GAP = 1 << 20  # members closer than this share one request


class RangesUnsupported(Exception):
    """The server or the archive does not allow a partial read."""


@functools.cache
def _tls() -> ssl.SSLContext:
    # Made once: loading the CA store costs more than a small request.
    return ssl.create_default_context()


def _get(url: str, range_spec: str) -> tuple[bytes, int]:
    """The bytes of ``range_spec`` and the file's total size."""
    req = urllib.request.Request(url, headers={"Range": f"bytes={range_spec}"})
    context = _tls() if url.startswith("https:") else None
    with urllib.request.urlopen(req, timeout=120, context=context) as resp:
        content_range = resp.headers.get("Content-Range", "")
        if resp.status != 206 or "/" not in content_range:
            raise RangesUnsupported(f"{url}: no partial content (HTTP {resp.status})")
        return resp.read(), int(content_range.rsplit("/", 1)[1])


def _central_directory(url: str) -> tuple[int, dict[int, bytes]]:
    """File size and the pieces {offset: bytes} holding the central directory and its end record."""
    tail, size = _get(url, f"-{_TAIL}")
    at = tail.rfind(_EOCD)
    if at < 0 or len(tail) - at < 22:
        raise RangesUnsupported(f"{url}: no zip end record in the last {_TAIL} bytes")
    cd_size, cd_offset = struct.unpack("<II", tail[at + 12 : at + 20])
    if 0xFFFFFFFF in (cd_size, cd_offset):
        raise RangesUnsupported(f"{url}: ZIP64 archive")
    pieces = {size - len(tail): tail}
    if cd_offset < size - len(tail):
        cd, _ = _get(url, f"{cd_offset}-{min(cd_offset + cd_size, size - len(tail)) - 1}")
        pieces[cd_offset] = cd
    return size, pieces


def _runs(infos: list[zipfile.ZipInfo], ends: dict[int, int]) -> list[tuple[int, int]]:
    """Byte runs [start, end) covering the members, neighbours merged."""
    runs: list[list[int]] = []
    for info in sorted(infos, key=lambda i: i.header_offset):
        start, end = info.header_offset, ends[info.header_offset]
        if runs and start - runs[-1][1] < _GAP:
            runs[-1][1] = max(runs[-1][1], end)
        else:
            runs.append([start, end])
    return [(s, e) for s, e in runs]


def extract(url: str, dest: Path, wanted: Callable[[str], bool], scratch: Path) -> int:
    """Extract the members whose names ``wanted`` accepts into ``dest``; the bytes read."""
    size, pieces = _central_directory(url)
    fetched = sum(len(p) for p in pieces.values())
    with open(scratch, "wb") as sparse:
        sparse.truncate(size)
        for offset, data in pieces.items():
            sparse.seek(offset)
            sparse.write(data)
    with zipfile.ZipFile(scratch) as zf:
        infos = zf.infolist()
        cd_start = min(pieces)
        # A member's bytes end where the next member (or the central directory) starts.
        offsets = sorted({i.header_offset for i in infos} | {cd_start, size})
        ends = {o: offsets[k + 1] for k, o in enumerate(offsets[:-1])}
        members = [i for i in infos if wanted(i.filename)]
        with open(scratch, "r+b") as sparse:
            for start, end in _runs(members, ends):
                data, _ = _get(url, f"{start}-{end - 1}")
                sparse.seek(start)
                sparse.write(data)
                fetched += len(data)
    with zipfile.ZipFile(scratch) as zf:
        zf.extractall(dest, [i.filename for i in zf.infolist() if wanted(i.filename)])
    return fetched
