"""Python files of a released vLLM wheel read with HTTP range requests
(``launcher.ranged_zip``), checked against the same files from the whole
wheel; and the refusal a server without range support gets."""

from __future__ import annotations

import http.server
import threading
import zipfile

import pytest

from launcher import pypi, ranged_zip

pytestmark = pytest.mark.network

WANTED = ("vllm/envs.py", "vllm/config/kernel.py")


def _wheel_url(version: str) -> str:
    return pypi._pick(pypi._index_files("vllm"), "vllm", version, "wheel", "x86_64").url


def test_ranged_members_equal_the_released_files(tmp_path):
    fetched = ranged_zip.extract(_wheel_url("0.29.0"), tmp_path / "out", WANTED.__contains__, tmp_path / "sparse")
    released = pypi.unpacked("vllm", "0.29.0", "site-packages")
    for rel in WANTED:
        assert (tmp_path / "out" / rel).read_bytes() == (released / rel).read_bytes(), rel
    # The central directory plus two members, not the 300 MB wheel.
    assert fetched < 3_000_000, fetched
    assert sorted(p.relative_to(tmp_path / "out").as_posix() for p in (tmp_path / "out").rglob("*.py")) == sorted(WANTED)


def test_every_python_file_of_a_wheel_by_ranges(tmp_path):
    """The unpacked tree the patch checks use, made the ranged way, is the
    wheel's: the same names, and every member's CRC checked by zipfile."""
    out = tmp_path / "out"
    ranged_zip.extract(_wheel_url("0.26.0"), out, pypi._python_file, tmp_path / "sparse")
    released = pypi.unpacked("vllm", "0.26.0", "site-packages")
    names = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert names == {p.relative_to(released).as_posix() for p in released.rglob("*")
                     if p.is_file() and p.name != ".complete"}
    assert (out / "vllm" / "config" / "model.py").read_bytes() == (released / "vllm" / "config" / "model.py").read_bytes()


@pytest.fixture
def plain_server(tmp_path):
    """A local HTTP server without range support (Python's own file server)."""
    with zipfile.ZipFile(tmp_path / "w.whl", "w") as zf:
        zf.writestr("pkg/a.py", "x = 1\n")
    handler = lambda *a, **kw: http.server.SimpleHTTPRequestHandler(*a, directory=str(tmp_path), **kw)  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/w.whl"
    server.shutdown()


def test_a_server_without_ranges_is_refused_so_the_caller_downloads(plain_server, tmp_path):
    with pytest.raises(ranged_zip.RangesUnsupported, match="no partial content"):
        ranged_zip.extract(plain_server, tmp_path / "out", lambda n: True, tmp_path / "sparse")
    assert not (tmp_path / "out").exists()
