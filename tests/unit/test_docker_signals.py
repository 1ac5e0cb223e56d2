"""The docker runtime stops and removes its container on SIGTERM, SIGHUP and SIGQUIT, and exits 128+N.

Issue 55.10: SIGTERM took the Ctrl-C path and exited 130; SIGHUP (a closed
terminal) ended the launcher and left the container serving. There is no
Docker daemon here, so the daemon's client is a stand-in that records what
the launcher asks of it; everything else is real: the launcher's own
signal handling, a real signal sent to this process, and a real HTTP server
answering the container's published /health.
"""

from __future__ import annotations

import http.server
import os
import signal
import threading

import docker
import pytest

from launcher.plan import Plan
from launcher.runtime import docker as rt


class _Container:
    """What the launcher calls on a container; ``wait`` blocks until it is stopped."""

    def __init__(self, calls: list[str], running: threading.Event):
        self.calls, self.running = calls, running
        self.stopped = threading.Event()
        self.status, self.attrs, self.labels = "created", {"State": {}}, {}

    def start(self):
        self.calls.append("start")
        self.status = "running"

    def reload(self):
        pass

    def logs(self, stream, follow):
        while not self.stopped.wait(0.05):
            yield from ()
        return

    def wait(self):
        self.calls.append("wait")
        self.running.set()
        while not self.stopped.wait(0.05):
            pass
        return {"StatusCode": 0}

    def stop(self, timeout):
        self.calls.append("stop")
        self.stopped.set()

    def remove(self, force):
        self.calls.append("remove")
        self.stopped.set()


class _Client:
    def __init__(self, container: _Container):
        self.container = container
        self.images = self
        self.containers = self

    def get(self, name):  # images.get and containers.get: the image exists, no container does yet
        if name.startswith("vllm-sm12x:"):
            return object()
        raise docker.errors.NotFound("no such container")

    def create(self, image, **kwargs):
        self.container.calls.append("create")
        return self.container


@pytest.fixture
def health_port():
    """A real server answering /health with 200, where the container's port would be published."""

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP", "SIGQUIT"])
def test_a_signal_stops_and_removes_the_container_and_exits_128_plus_n(signame, health_port, tmp_path, monkeypatch):
    models = tmp_path / "models"
    (models / "target").mkdir(parents=True)
    monkeypatch.setenv("MODELS_DIR", str(models))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    argv = ["vllm", "serve", str(models / "target"), "--host", "127.0.0.1", "--port", str(health_port)]
    plan = Plan(recipe="gemma4-e4b", profile="rtx5090", profile_source="--profile", vllm_version="0.21.0",
                vllm_version_source="--vllm-version", runtime="docker", model=models / "target", drafter=None,
                host="127.0.0.1", port=health_port, env={}, argv=argv, image="vllm-sm12x:0.21.0-sm120-amd64")
    calls: list[str] = []
    running = threading.Event()
    container = _Container(calls, running)
    signum = getattr(signal, signame)

    def send_when_serving():
        if running.wait(60):
            os.kill(os.getpid(), signum)

    def not_handled(*_):  # where the launcher does not handle the signal: the container just ends
        container.stopped.set()

    original = signal.signal(signum, not_handled)  # without it an unhandled SIGHUP would end pytest itself
    try:
        threading.Thread(target=send_when_serving, daemon=True).start()
        code = rt.run(plan, client=_Client(container), gpus=None, wait_timeout=30)
        assert signal.getsignal(signum) is not_handled  # the launcher's handler is gone again
    finally:
        signal.signal(signum, original)
    assert code == 128 + signum
    assert calls == ["create", "start", "wait", "stop", "remove"]
