"""User errors that ended in a Python traceback now end in a LauncherError that says what to do:
a slow `vllm bench serve`, a package index that serves HTML, a Hub token file that cannot be read.
Each runs the real thing it depends on here: a real child process, a real HTTP server, a real file."""

from __future__ import annotations

import http.server
import sys
import threading
from pathlib import Path

import pytest

from launcher import pypi
from launcher.bench import vllm_bench, workload
from launcher.bench.client import Target
from launcher.errors import LauncherError
from launcher.recipe import BenchWorkload


def test_a_vllm_bench_past_its_timeout_is_a_launcher_error(tmp_path, monkeypatch):
    slow = tmp_path / "vllm"  # a stand-in `vllm` on PATH (vLLM itself needs a GPU stack)
    slow.write_text("#!" + sys.executable + "\nimport time\ntime.sleep(30)\n")
    slow.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    run = workload.Run(BenchWorkload(name="w", dataset="random"), concurrency=1, num_prompts=1)
    with pytest.raises(LauncherError, match=r"did not finish .* within 0.5 s") as info:
        vllm_bench.run_level(Target("http://127.0.0.1:9", "m"), run, tokenizer="/m", temperature=0.0, seed=0,
                             ignore_eos=True, timeout=0.5, echo=lambda _: None)
    assert "--timeout" in info.value.hint


def test_an_index_that_serves_html_is_named(monkeypatch):
    class Html(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            body = b"<html><body><a href='vllm-0.33.0.tar.gz'>vllm</a></body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Html)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setattr(pypi, "INDEX", f"http://127.0.0.1:{server.server_address[1]}/simple")
        with pytest.raises(LauncherError, match="not JSON") as info:
            pypi.latest_release("vllm")
        assert "PEP 691" in info.value.hint
    finally:
        server.shutdown()


def test_an_unreadable_hub_token_file_is_reported_not_raised(tmp_path, monkeypatch):
    from huggingface_hub import constants

    from launcher.models import hub

    token = tmp_path / "token"
    token.write_bytes(b"\xff\xfe not utf-8")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(token))
    assert hub.auth_state() == f"unreadable token file {Path(token)} (not UTF-8)"
    token.write_text("hf_stored\n")
    assert hub.auth_state() == "the token stored by `hf auth login`"


def test_models_pull_refuses_a_models_dir_that_is_a_file_in_the_dry_run_too(tmp_path):
    """The dry run showed the file's disk as free room and `[absent]`; the real pull then failed
    on "Not a directory"."""
    import os
    import subprocess
    import sys

    a_file = tmp_path / "models"
    a_file.write_text("kept")
    env = {**os.environ, "MODELS_DIR": str(a_file)}
    for extra in (["--dry-run"], ["--offline"]):
        res = subprocess.run([sys.executable, "-m", "launcher", "models", "pull", "-r", "gemma4-moe", *extra],
                             capture_output=True, text=True, env=env, timeout=120)
        assert res.returncode == 2, res.stdout + res.stderr
        assert f"{a_file} is a file, not a folder" in res.stderr and "free at" not in res.stdout
    assert a_file.read_text() == "kept"
