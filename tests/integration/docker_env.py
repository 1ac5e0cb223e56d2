"""The real Docker daemon and the local images the docker tests use.

No registry is reachable on CI: ``tests/engines.sh`` starts dockerd and imports
two base images (names mirrored here). The images below are built on top of
them through the SDK's classic (non-BuildKit) build API, tagged by a hash of
their build context so a second run finds them and builds nothing.

* ``fake_vllm_image``: busybox + the real ``docker/entrypoint.sh`` + a shell
  script standing in for ``vllm serve`` (this machine has no GPU and the real
  server needs one). It serves ``/health`` with busybox httpd; env variables
  choose how it behaves (crash at startup, exit after ready, start slowly).
"""

from __future__ import annotations

import hashlib
import io
import socket
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Keep in step with tests/engines.sh.
BUSYBOX_IMAGE = "vllm-sm12x-test/busybox:r1"
PYTHON_IMAGE = "vllm-sm12x-test/python:bookworm-r1"

FAKE_VLLM = r"""#!/bin/sh
# Stand-in for `vllm serve` (no GPU here). FAKE_VLLM_MODE: serve (default),
# crash (fails during startup), exit-after-ready (serves, then exits).
echo "fake-vllm argv: $*"
echo "fake-vllm key: ${VLLM_API_KEY:-none}"
port=8000
while [ $# -gt 0 ]; do
    case "$1" in
        --port) port=$2; shift ;;
        --port=*) port=${1#--port=} ;;
    esac
    shift
done
if [ "${FAKE_VLLM_MODE:-serve}" = crash ]; then
    echo "Traceback (most recent call last):"
    echo "ValueError: fake startup failure"
    exit "${FAKE_VLLM_EXIT_CODE:-3}"
fi
sleep "${FAKE_VLLM_STARTUP_S:-1}"
mkdir -p /tmp/www && echo ok > /tmp/www/health
httpd -f -p "0.0.0.0:$port" -h /tmp/www &
pid=$!
trap 'kill $pid; echo "fake-vllm: stopped"; exit 0' TERM INT
echo "fake-vllm: serving on 0.0.0.0:$port"
if [ "${FAKE_VLLM_MODE:-serve}" = exit-after-ready ]; then
    sleep "${FAKE_VLLM_READY_S:-2}"
    kill $pid
    exit "${FAKE_VLLM_EXIT_CODE:-0}"
fi
wait $pid
"""

FAKE_DOCKERFILE = f"""FROM {BUSYBOX_IMAGE}
COPY entrypoint.sh /usr/local/bin/entrypoint.sh
COPY vllm /bin/vllm
ENTRYPOINT ["/usr/local/bin/entrypoint.sh"]
"""


def client():
    """A client for the real daemon; fails (never skips) with what to run."""
    import docker

    try:
        c = docker.from_env(timeout=120)
        c.ping()
    except docker.errors.DockerException as exc:
        pytest.fail(f"no Docker daemon answers ({exc}); run `bash tests/engines.sh` (as root it starts one)")
    for image in (BUSYBOX_IMAGE, PYTHON_IMAGE):
        try:
            c.images.get(image)
        except docker.errors.ImageNotFound:
            pytest.fail(f"base image {image} is missing; run `bash tests/engines.sh`")
    return c


def _tar(files: dict[str, tuple[bytes, int]]) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, (data, mode) in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = mode
            tf.addfile(info, io.BytesIO(data))
    buf.seek(0)
    return buf


def build_from_files(c, repo: str, files: dict[str, tuple[bytes, int]]) -> str:
    """Build (once per content) an image from an in-memory context; return its tag."""
    import docker

    digest = hashlib.sha256()
    for name, (data, mode) in sorted(files.items()):
        digest.update(name.encode() + b"\0" + str(mode).encode() + b"\0" + data)
    tag = f"{repo}:{digest.hexdigest()[:12]}"
    try:
        c.images.get(tag)
        return tag
    except docker.errors.ImageNotFound:
        pass
    c.images.build(fileobj=_tar(files), custom_context=True, tag=tag, rm=True, forcerm=True)
    return tag


def fake_vllm_image(c) -> str:
    entrypoint = (REPO / "docker" / "entrypoint.sh").read_bytes()
    return build_from_files(
        c,
        "vllm-sm12x-test/fake-vllm",
        {
            "Dockerfile": (FAKE_DOCKERFILE.encode(), 0o644),
            "entrypoint.sh": (entrypoint, 0o755),
            "vllm": (FAKE_VLLM.encode(), 0o755),
        },
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def containers_named(c, name: str) -> list:
    return c.containers.list(all=True, filters={"name": f"^/{name}$"})
