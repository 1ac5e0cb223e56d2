"""An HTTP server on 127.0.0.1 in a background thread, for the test stand-ins
of services that cannot run here (the Hugging Face Hub, a GPU-bound vLLM)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _Server(ThreadingHTTPServer):
    # A burst of concurrent clients must not wait on SYN retries (the default backlog is 5).
    request_queue_size = 128
    daemon_threads = True


class LocalHTTP:
    """Subclasses build their handler in ``_handler()``; ``with`` starts and stops it."""

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        raise NotImplementedError

    def _listen(self, port: int = 0) -> None:
        self._server = _Server(("127.0.0.1", port), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
