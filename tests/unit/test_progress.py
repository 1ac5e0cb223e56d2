"""Progress output for long work, through real transfers and real files."""

from __future__ import annotations

import hashlib
import http.server
import threading

import pytest

from launcher import progress, pypi


@pytest.fixture
def blob_server(tmp_path):
    blob = bytes(range(256)) * 4096 * 3  # 3 MiB
    (tmp_path / "vllm-9.9.9.tar.gz").write_bytes(blob)

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **kw):
            super().__init__(*a, directory=str(tmp_path), **kw)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/vllm-9.9.9.tar.gz", blob
    srv.shutdown()
    srv.server_close()


def test_download_reports_size_and_rate(blob_server, tmp_path, capsys):
    url, blob = blob_server
    target = tmp_path / "out" / "vllm-9.9.9.tar.gz"
    target.parent.mkdir()
    pypi._download(pypi.ReleaseFile("vllm-9.9.9.tar.gz", url, hashlib.sha256(blob).hexdigest()), target)
    assert target.read_bytes() == blob
    err = capsys.readouterr().err
    assert "downloading vllm-9.9.9.tar.gz (3.1 MB)" in err
    done = next(ln for ln in err.splitlines() if "done:" in ln)
    assert "3.1 MB of 3.1 MB in" in done and "/s)" in done


def test_last_line_reads_the_tail_of_a_growing_log(tmp_path):
    log = tmp_path / "build.log"
    log.write_text("x" * 20000 + "\n[12/400] Building CUDA object a.cu.o\r[13/400] Building CUDA object b.cu.o\n\n")
    assert progress.last_line(log) == "[13/400] Building CUDA object b.cu.o"
    assert progress.last_line(tmp_path / "missing.log") == ""


@pytest.mark.parametrize("seconds, text", [(5, "5s"), (65, "1m05s"), (3725, "1h02m05s")])
def test_elapsed_is_readable(seconds, text):
    assert progress.fmt_elapsed(seconds) == text
