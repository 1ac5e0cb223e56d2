"""A real Python environment (a venv) holding a stand-in ``vllm`` package.

vLLM cannot serve here (no GPU), so its entry point
``vllm.entrypoints.cli.main`` is played by a tiny HTTP server answering
/health and /v1/chat/completions that records its interpreter, argv and
environment. The venv, its metadata, its ``vllm`` console script and the
interpreter the launcher finds and starts are all real.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SERVER = textwrap.dedent("""\
    import json, os, signal, sys, time
    from http.server import BaseHTTPRequestHandler, HTTPServer
    argv = sys.argv[1:]
    port = int(argv[argv.index("--port") + 1])
    # Written whole, then renamed into place: a test that waits for the file reads it at once,
    # and on a loaded machine it found it half-written (JSONDecodeError).
    with open(os.environ["FAKE_RECORD"] + ".part", "w") as fh:
        json.dump({"argv": argv, "env": dict(os.environ), "python": sys.executable,
                   "version": VERSION, "pid": os.getpid()}, fh)
    os.replace(os.environ["FAKE_RECORD"] + ".part", os.environ["FAKE_RECORD"])
    if os.environ.get("FAKE_EXIT"):
        sys.exit(int(os.environ["FAKE_EXIT"]))
    if os.environ.get("FAKE_NEVER_READY"):
        # Starts, never listens, and shuts down cleanly (exit 0) on SIGINT like vLLM.
        signal.signal(signal.SIGINT, lambda *_: sys.exit(0))
        while True:
            time.sleep(0.2)
    served = []
    class H(BaseHTTPRequestHandler):
        def log_message(self, *a): pass
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404); self.end_headers()
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            auth = self.headers.get("Authorization")
            out = json.dumps({"choices": [{"message": {"content": "hi from " + body["model"] + " " + str(auth)}}]}).encode()
            out = os.environ.get("FAKE_CHAT_REPLY", "").encode() or out  # a server answering in another shape
            self.send_response(200); self.send_header("Content-Length", str(len(out))); self.end_headers()
            self.wfile.write(out)
            served.append(1)
    srv = HTTPServer(("127.0.0.1", port), H)
    while not served:
        srv.handle_request()
    sys.exit(3)
""")


def make_env(root: Path, version: str = "0.33.0", *, with_vllm: bool = True) -> Path:
    """Create a venv at ``root`` (with a stand-in vLLM ``version``); return its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    python = root / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")
    if not with_vllm:
        return python
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    make_site(site, version)
    script = python.parent / "vllm"
    # What pip writes for a console script: the venv's python on the #! line.
    script.write_text(f"#!{python}\nimport sys\nfrom vllm.entrypoints.cli.main import main\nsys.exit(main())\n")
    script.chmod(0o755)
    return python


def make_site(site: Path, version: str = "0.21.0") -> Path:
    """The stand-in ``vllm`` package and its dist-info in ``site``: a venv's purelib, or a plain
    folder put on PYTHONPATH (how the GPU harness installs vLLM: pip --target)."""
    pkg = site / "vllm"
    (pkg / "entrypoints" / "cli").mkdir(parents=True)
    (pkg / "__init__.py").write_text(f'__version__ = "{version}"\n')
    (pkg / "entrypoints" / "__init__.py").write_text("")
    (pkg / "entrypoints" / "cli" / "__init__.py").write_text("")
    (pkg / "entrypoints" / "cli" / "main.py").write_text(f"VERSION = {version!r}\n" + SERVER)
    info = site / f"vllm-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    return site
