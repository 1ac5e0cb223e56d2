"""The native runtime starts a real child process with the plan's env.

vLLM cannot serve here (no GPU), so a stand-in `vllm` executable on PATH
plays it: a tiny HTTP server answering /health and /v1/chat/completions that
records its argv and environment. Everything else (process start, env merge,
health wait, chat request, exit code) is the real runtime.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import sys
import textwrap

import pytest

from launcher.plan import Request, resolve
from launcher.runtime import native
from tests.unit.conftest import RTX5090, make_ctx

FAKE_VLLM = textwrap.dedent("""\
    #!{python}
    import json, os, sys
    from http.server import BaseHTTPRequestHandler, HTTPServer
    argv = sys.argv[1:]
    port = int(argv[argv.index("--port") + 1])
    with open(os.environ["FAKE_RECORD"], "w") as fh:
        json.dump({{"argv": argv, "env": dict(os.environ)}}, fh)
    if os.environ.get("FAKE_EXIT"):
        sys.exit(int(os.environ["FAKE_EXIT"]))
    served = []
    class H(BaseHTTPRequestHandler):
        def log_message(self, *a): pass
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404); self.end_headers()
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            auth = self.headers.get("Authorization")
            out = json.dumps({{"choices": [{{"message": {{"content": "hi from " + body["model"] + " " + str(auth)}}}}]}}).encode()
            self.send_response(200); self.send_header("Content-Length", str(len(out))); self.end_headers()
            self.wfile.write(out)
            served.append(1)
    srv = HTTPServer(("127.0.0.1", port), H)
    while not served:
        srv.handle_request()
    sys.exit(3)
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def fake_vllm(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "vllm"
    exe.write_text(FAKE_VLLM.format(python=sys.executable))
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    record = tmp_path / "record.json"
    monkeypatch.setenv("FAKE_RECORD", str(record))
    return record


def test_native_run_waits_for_health_and_chats(fake_vllm, models, capsys, monkeypatch):
    monkeypatch.setenv("VLLM_NVFP4_GEMM_BACKEND", "cutlass")  # stale for 0.33.0
    port = _free_port()
    plan = resolve(Request("gemma4-moe-dflash", vllm_version="0.33.0", port=port, api_key="sk-test-key"),
                   make_ctx(RTX5090, environ=dict(os.environ)))
    code = native.run(plan, wait=True, timeout=30)
    assert code == 3  # the child's exit code is the launcher's
    rec = json.loads(fake_vllm.read_text())
    assert rec["argv"][:2] == ["serve", str(models / "gemma-4-26B-A4B-it-NVFP4")]
    assert rec["env"]["VLLM_USE_FLASHINFER_SAMPLER"] == "1"
    assert rec["env"]["VLLM_API_KEY"] == "sk-test-key"
    assert "VLLM_NVFP4_GEMM_BACKEND" not in rec["env"]
    assert "sk-test-key" not in " ".join(rec["argv"])
    out = capsys.readouterr().out
    assert f"http://127.0.0.1:{port}/v1" in out and "hi from gemma4 Bearer sk-test-key" in out


def test_native_run_reports_early_exit(fake_vllm, models, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_EXIT", "7")
    plan = resolve(Request("gemma4-e4b", vllm_version="0.21.0", port=_free_port()), make_ctx(RTX5090))
    assert native.run(plan, wait=True, timeout=30) == 7
    assert "exited with code 7 before it was ready" in capsys.readouterr().err
