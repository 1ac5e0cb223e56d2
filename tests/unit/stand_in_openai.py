"""What the CPU tests' stand-in vLLM servers share (vLLM needs a GPU): an OpenAI-style handler
answering ``/health``, ``/v1/models`` and ``/metrics``, a streamed completion, and the server loop.
A stand-in script imports it from this folder (``sys.path``) and adds its own ``metrics`` and
``do_POST``."""

from __future__ import annotations

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

HERE = str(Path(__file__).resolve().parent)  # what a stand-in script puts on sys.path


class Handler(BaseHTTPRequestHandler):
    model = "gemma4"

    def log_message(self, *args):
        pass

    def send_body(self, body: str, kind: str = "application/json") -> None:
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def metrics(self) -> str:
        """The ``/metrics`` text (Prometheus lines)."""
        return ""

    def do_GET(self):
        if self.path == "/health":
            self.send_body("")
        elif self.path == "/v1/models":
            self.send_body(json.dumps({"data": [{"id": self.model}]}))
        elif self.path == "/metrics":
            self.send_body(self.metrics(), "text/plain")
        else:
            self.send_response(404)
            self.end_headers()

    def read_body(self) -> dict:
        return json.loads(self.rfile.read(int(self.headers["Content-Length"])))

    def stream(self, chunks: int, usage: dict) -> None:
        """A streamed completion: ``chunks`` text events, then the usage, then ``[DONE]``."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for _ in range(chunks):
            self.wfile.write(b'data: {"choices": [{"text": "t"}]}\n\n')
        self.wfile.write(("data: " + json.dumps({"choices": [], "usage": usage}) + "\n\n").encode())
        self.wfile.write(b"data: [DONE]\n\n")


def serve(port: int, handler: type, queue: int = 64) -> None:
    """Serve until interrupted (the harness stops a server's process group)."""
    ThreadingHTTPServer.request_queue_size = queue
    srv = ThreadingHTTPServer(("127.0.0.1", port), handler)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        sys.exit(0)
