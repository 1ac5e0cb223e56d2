"""The real Docker daemon and the local images the docker tests use.

No registry is reachable on CI: ``tests/engines.sh`` starts dockerd and imports
two base images (names mirrored here). The images below are built on top of
them through the SDK's classic (non-BuildKit) build API, tagged by a hash of
their build context and this run's id (``RUN_ID``): two test runs on one
machine share the daemon, and a tag another run could re-point or remove
while this one uses it made that run's tests fail. Beside its run tag each
such image keeps a content tag (``<content>-cache``), so a later run's build
of the same content is a cache hit and nothing is left untagged. At the end
of a run (tests/integration/conftest.py, ``cleanup_run``) its containers, its
run tags and what its failed builds left go; at the start, the same for runs
that ended without cleaning up (killed) more than ``STALE_AFTER_S`` ago
(``sweep_stale_runs``). Dangling images no longer pile up, run after run.
The files the runs share under ~/.cache/vllm-sm12x are filled under a lock
(``fill_once``).

* ``fake_vllm_image``: busybox + the real ``docker/entrypoint.sh`` + a shell
  script standing in for ``vllm serve`` (this machine has no GPU and the real
  server needs one). It serves ``/health`` with busybox httpd; env variables
  choose how it behaves (crash at startup, exit after ready, start slowly).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import itertools
import json
import os
import re
import socket
import sys
import tarfile
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
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
    global _USED
    if not _USED:  # the first docker test of this run: what killed runs left goes first
        _USED = True
        sweep_stale_runs(c)
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


# This test run (one pytest process): every image tag it makes ends with it. The
# start time in it lets a later run tell a killed run's leftovers from a live one's.
RUN_STARTED = int(time.time())
RUN_ID = f"run{os.getpid()}-{RUN_STARTED}-{uuid.uuid4().hex[:8]}"
_RUN_TAGS: list[str] = []
_USED = False  # this run talked to the daemon (client()): cleanup_run has work at its end
TEST_REPO = "vllm-sm12x-test/"
# No `make test` runs this long: a run that started earlier and left images was killed.
STALE_AFTER_S = 12 * 3600
# -run<pid>-<start>-<hex8> (and, from before the start time was in it, -run<pid>-<hex8>)
_RUN_ID_RE = re.compile(r"run(\d+)-(?:(\d{9,11})-)?[0-9a-f]{8}")
BASE_NAME_LABEL = "org.opencontainers.image.base.name"


def run_tag(repo: str, content_key: str) -> str:
    """``repo:<content>-<run>``: says what the image holds, and that this run owns the tag."""
    return f"{repo}:{content_key}-{RUN_ID}"


def cache_tag(repo: str, content_key: str) -> str:
    """``repo:<content>-cache``: the content's image kept between runs (docker's build cache),
    under a name, so that removing the run tags leaves no untagged (dangling) image."""
    return f"{repo}:{content_key}-cache"


def build_log_text(build_log) -> str:
    """A classic build's log as the daemon streamed it: every step's command and its output."""
    return "".join(chunk.get("stream", "") or chunk.get("error", "") for chunk in build_log
                   if isinstance(chunk, dict))


def built_layers(log_text: str) -> list[str]:
    """The image ids a classic build made or reused, step by step (`` ---> 1a2b3c4d5e6f``)."""
    return re.findall(r"^ ---> ([0-9a-f]{12})\s*$", log_text, re.M)


def remove_failed_build(c, log_text: str) -> None:
    """A failed classic build leaves the image of its last good step, untagged and with no
    child: a dangling image, one per failed build. Remove it (and its untagged parents that
    nothing else uses; the daemon refuses where an image still has a child or a container)."""
    import docker

    layers = built_layers(log_text)
    if layers:
        with contextlib.suppress(docker.errors.ImageNotFound, docker.errors.APIError):
            c.images.remove(layers[-1])


def build_from_files(c, repo: str, files: dict[str, tuple[bytes, int]]) -> str:
    """Build an image from an in-memory context under this run's tag; return the tag.

    A failed build fails the test with the log's tail: the failing command's own
    output (pip's, say), not only docker's "returned a non-zero code"."""
    import docker

    digest = hashlib.sha256()
    for name, (data, mode) in sorted(files.items()):
        digest.update(name.encode() + b"\0" + str(mode).encode() + b"\0" + data)
    key = digest.hexdigest()[:12]
    tag = run_tag(repo, key)
    if tag in _RUN_TAGS:
        return tag
    try:
        image, _ = c.images.build(fileobj=_tar(files), custom_context=True, tag=tag, rm=True, forcerm=True)
    except docker.errors.BuildError as exc:
        text = build_log_text(exc.build_log)
        remove_failed_build(c, text)
        pytest.fail(f"docker build of {tag} failed: {exc.msg}\n{text[-5000:]}")
    _RUN_TAGS.append(tag)
    cache_repo, _, cache_name = cache_tag(repo, key).rpartition(":")
    image.tag(cache_repo, cache_name)
    return tag


def _remove_containers_of(c, image: str) -> None:
    """Remove the containers created from the tag ``image``. The daemon's ``ancestor`` filter
    resolves a tag to its image id, so it also lists the containers that another run (or
    another pytest-xdist worker of this run) created from its own tag of the same content:
    only those whose configured image is this very tag go."""
    import docker

    # sparse: the daemon's list alone (no inspect of each, which fails for a container
    # another run removes meanwhile); its "Image" is the name the container was created from.
    for container in c.containers.list(all=True, sparse=True, filters={"ancestor": image}):
        if container.attrs.get("Image") != image:
            continue
        with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
            container.remove(force=True)


def remove_run_tags(c=None) -> None:
    """Remove the images this run tagged (and any container left on them). The content
    stays under its cache tag, the next run's build cache."""
    if not _RUN_TAGS:
        return
    import docker

    c = c or docker.from_env(timeout=120)
    while _RUN_TAGS:
        tag = _RUN_TAGS.pop()
        _remove_containers_of(c, tag)
        with contextlib.suppress(docker.errors.ImageNotFound, docker.errors.APIError):
            c.images.remove(tag)


def _run_started(name: str) -> tuple[str, int, int | None] | None:
    """(run id, its pid, its start time or None for the older form) of a name holding a run id."""
    found = _RUN_ID_RE.search(name)
    if not found:
        return None
    return found.group(0), int(found.group(1)), int(found.group(2)) if found.group(2) else None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def images(c, **kwargs) -> list:
    """``c.images.list(**kwargs)``, again when an image went between the daemon's list and the
    SDK's inspect of it (removed by a run, or an xdist worker, beside this one)."""
    import docker

    for _ in range(10):
        try:
            return c.images.list(**kwargs)
        except docker.errors.ImageNotFound:
            time.sleep(0.2)
    return c.images.list(**kwargs)


def _dangling_of_runs(c) -> list:
    """Untagged leaf images a test build left: their base-name label names a test image."""
    return [image for image in images(c, filters={"dangling": True, "label": BASE_NAME_LABEL})
            if (image.labels.get(BASE_NAME_LABEL) or "").startswith(TEST_REPO)]


def _created(image) -> float:
    from datetime import datetime

    stamp = image.attrs.get("Created", "")
    try:
        return datetime.fromisoformat(stamp[:19] + "+00:00").timestamp()
    except ValueError:
        return time.time()


def cleanup_run(c=None) -> None:
    """The end of this run: its run tags and containers, and the dangling images its builds
    left (an overlay whose base was one of this run's images names it in its label)."""
    import docker

    if c is None and not (_USED or _RUN_TAGS):
        return  # no docker test ran: nothing to clean, and no daemon to ask
    c = c or docker.from_env(timeout=120)
    remove_run_tags(c)
    for image in images(c):  # tags made with run_tag outside build_from_files (the overlays)
        for tag in image.tags:
            if tag.startswith(TEST_REPO) and tag.endswith(f"-{RUN_ID}"):
                _remove_containers_of(c, tag)
                with contextlib.suppress(docker.errors.ImageNotFound, docker.errors.APIError):
                    c.images.remove(tag)
    for image in _dangling_of_runs(c):
        if RUN_ID in image.labels.get(BASE_NAME_LABEL, ""):
            with contextlib.suppress(docker.errors.ImageNotFound, docker.errors.APIError):
                c.images.remove(image.id)


def sweep_lock():
    """Held by every sweep: two sweeps at once (runs, or xdist workers, starting their docker
    tests together) took each other's removals, and a sweep's list of what went missed them."""
    from launcher.paths import cache_dir

    return cache_lock(cache_dir() / "locks" / "docker-sweep")


def sweep_stale_runs(c, now: float | None = None, *, lock: bool = True) -> list[str]:
    """What runs killed before their end left: their run tags (with containers on them) and
    the dangling images of their builds, once the run started more than ``STALE_AFTER_S``
    ago (the older run ids, without a start time: by the image's age, unless their pid
    still runs here). A run beside this one is never touched. Returns what went.
    ``lock=False``: the caller holds :func:`sweep_lock` already."""
    if lock:
        with sweep_lock():
            return sweep_stale_runs(c, now, lock=False)
    import docker

    now = time.time() if now is None else now
    gone: list[str] = []

    def stale(name: str, image) -> bool:
        found = _run_started(name)
        if found is None or found[0] == RUN_ID:
            return False
        _, pid, started = found
        if started is None:  # the older form: the image's age, and never while its pid runs here
            if _pid_alive(pid):
                return False
            started = _created(image)
        return now - started > STALE_AFTER_S

    for image in images(c):
        for tag in image.tags:
            if tag.startswith(TEST_REPO) and stale(tag.rpartition(":")[2], image):
                _remove_containers_of(c, tag)
                with contextlib.suppress(docker.errors.ImageNotFound, docker.errors.APIError):
                    c.images.remove(tag)
                    gone.append(tag)
    for image in _dangling_of_runs(c):
        if stale(image.labels[BASE_NAME_LABEL].rpartition(":")[2], image):
            with contextlib.suppress(docker.errors.ImageNotFound, docker.errors.APIError):
                c.images.remove(image.id)
                gone.append(image.id)
    return gone


@contextlib.contextmanager
def cache_lock(path: Path) -> Iterator[None]:
    """Hold ``<path>.lock``: one test run at a time writes a shared cache entry."""
    from filelock import FileLock

    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):
        yield


def fill_once(done: Path, fill: Callable[[], None]) -> None:
    """Run ``fill`` unless ``done`` exists, under the lock of ``done``: two runs
    never write one cache entry at once, and the one that waited finds it made.
    ``fill`` must create ``done`` last, once the entry is whole."""
    if done.exists():
        return
    with cache_lock(done):
        if not done.exists():
            fill()


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


# Ports for containers come from a block of this run's own, below the kernel's
# ephemeral range: with bind(0), two runs beside each other were handed the same
# port between the probe and the daemon's bind ("port is already allocated").
# Two runs (or two pytest-xdist workers of one run: each is a run with its own
# RUN_ID) can still draw the same block, so each port handed out is also claimed
# with a lock file held for the rest of the process: a port another test process
# holds is passed over.
_PORT_BLOCK = 20000 + (zlib.crc32(RUN_ID.encode()) % 100) * 100
_next_port = itertools.count(_PORT_BLOCK)
_CLAIMED_PORTS: list = []  # the open lock files of the ports this process handed out


def _claim_port(port: int) -> bool:
    import fcntl

    from launcher.paths import cache_dir

    folder = cache_dir() / "locks" / "test-ports"
    folder.mkdir(parents=True, exist_ok=True)
    handle = open(folder / f"{port}.lock", "a")  # noqa: SIM115 (held until the process ends)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        return False
    _CLAIMED_PORTS.append(handle)
    return True


def free_port() -> int:
    for port in _next_port:
        if port >= _PORT_BLOCK + 100:
            break
        if not _claim_port(port):
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port left in this run's block {_PORT_BLOCK}-{_PORT_BLOCK + 99}")


def containers_named(c, name: str) -> list:
    return c.containers.list(all=True, filters={"name": f"^/{name}$"})


# --- a local base with the released vLLM, and the overlay built on it ---------
#
# Upstream's vllm/vllm-openai image cannot be pulled here. The stand-in is the
# debootstrap'd Debian python base plus the released vLLM wheel from PyPI,
# installed with `pip install --no-deps`, minus its compiled extensions (.so:
# 237 of its 248 MB; no patch touches them and nothing here can run them).
# Everything the patch engine reads (vllm/, the dist-info, the console
# script) is what the real wheel installs.

WHEEL_EPOCH = (2020, 1, 1, 0, 0, 0)  # fixed zip timestamps: same bytes every run, so docker's cache hits


def vllm_wheel_without_extensions(version: str) -> Path:
    """The released wheel rewritten without its .so files (made once, cached)."""
    from launcher.paths import cache_dir
    from launcher.pypi import fetch

    real = fetch("vllm", version, "wheel")
    out_dir = cache_dir() / "docker-tests"
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / real.name  # same name: the tags still say what the files are for
    fill_once(out, lambda: _strip_extensions(real, out))
    return out


def _strip_extensions(real: Path, out: Path) -> None:
    import base64
    import zipfile

    tmp = out.with_name(f".{out.name}.{RUN_ID}.part")
    with zipfile.ZipFile(real) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
        record_name = next(n for n in src.namelist() if n.endswith(".dist-info/RECORD"))
        rows = []
        for info in src.infolist():
            if info.filename.endswith(".so") or info.filename == record_name or info.is_dir():
                continue
            data = src.read(info)
            zi = zipfile.ZipInfo(info.filename, WHEEL_EPOCH)
            zi.external_attr = info.external_attr
            zi.compress_type = zipfile.ZIP_DEFLATED
            dst.writestr(zi, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            rows.append(f"{info.filename},sha256={digest},{len(data)}")
        rows.append(f"{record_name},,")
        zi = zipfile.ZipInfo(record_name, WHEEL_EPOCH)
        zi.compress_type = zipfile.ZIP_DEFLATED
        dst.writestr(zi, "\n".join(rows) + "\n")
    tmp.replace(out)


# --- stand-ins for the real bases ----------------------------------------------
#
# The overlay's real bases cannot be pulled here. Each stand-in reproduces what
# the overlay and its users meet in the real image, on the debootstrap'd
# Debian python base with the released vLLM wheel (above):
#
# vllm/vllm-openai:v<X> (vllm-project/vllm docker/Dockerfile, `vllm-openai`
#   target; read in the public Dockerfile and in third-party notes on v0.27.1):
#   root; ENTRYPOINT ["vllm", "serve"], no CMD; WORKDIR /vllm-workspace;
#   `python3` on PATH; vLLM, torch (from the PyTorch cu13x index: a +cu130
#   local tag) and FlashInfer installed system-wide with `uv pip install
#   --system` into /usr/local/lib/python3.12/dist-packages; a `vllm` user
#   (uid 2000, gid 0) exists but is not switched to; VLLM_USAGE_SOURCE set.
# nvcr.io/nvidia/vllm:<YY.MM>-py3 (NGC; its docs and third-party Dockerfiles
#   built FROM it): root; ENTRYPOINT ["/opt/nvidia/nvidia_entrypoint.sh"]
#   (banner, entrypoint.d scripts, then exec "$@"; a bare `serve` there would
#   be Ray Serve's CLI); WORKDIR /workspace; python3 with packages in
#   /usr/local/lib/python3.12/dist-packages; NVIDIA's own builds carry local
#   tags (vLLM "0.19.0+<sha>.nv26.04", torch "2.13.0a0+<sha>.nv26.06").
#
# Where the stand-ins differ: Debian bookworm's Python 3.11 instead of 3.12
# (same dist-packages layout under /usr/local/lib/python3.X); torch and
# FlashInfer are metadata only (their versions from the vLLM wheel's own
# pins, with the local tags above); PyPI's vLLM stands in for NGC's build of
# the same version; `vllm` is a stub that prints its arguments (no GPU here).

STUB_VLLM = r"""#!/bin/sh
# Stand-in for vLLM's console script (no GPU here): says how it was called.
echo "stub-vllm argv: $*"
echo "stub-vllm cwd: $(pwd)"
"""

NGC_ENTRYPOINT = r"""#!/bin/bash
# Stand-in for NGC's /opt/nvidia/nvidia_entrypoint.sh: banner, then the command.
echo "== vLLM == (stand-in for nvcr.io/nvidia/vllm:${NGC_TAG})"
echo "NVIDIA Release ${NVIDIA_VLLM_RELEASE} (stand-in)"
export NGC_ENTRYPOINT_RAN=1
if [ $# -eq 0 ]; then exec /bin/bash; fi
exec "$@"
"""

SITE = "/usr/local/lib/python3.11/dist-packages"


def wheel_pins(version: str) -> dict[str, str]:
    """``name==version`` pins from the released wheel's METADATA (torch, flashinfer-python)."""
    import re
    import zipfile

    with zipfile.ZipFile(vllm_wheel_without_extensions(version)) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        text = zf.read(meta).decode()
    pins = {}
    for name, pinned in re.findall(r"^Requires-Dist: ([A-Za-z0-9_.-]+) ?\(?==([^;,\s)]+)", text, re.M):
        pins[name.lower().replace("_", "-")] = pinned
    return pins


def standin(kind: str, version: str, *, vllm_build: str | None = None) -> dict:
    """What the stand-in of ``kind`` (upstream | ngc) with vLLM ``version`` holds."""
    pins = wheel_pins(version)
    if kind == "upstream":
        return {"kind": kind, "stands_for": f"vllm/vllm-openai:v{version}", "vllm": vllm_build or version,
                "torch": f"{pins['torch']}+cu130", "flashinfer-python": pins.get("flashinfer-python"),
                "workdir": "/vllm-workspace", "entrypoint": ["vllm", "serve"],
                "env": {"VLLM_USAGE_SOURCE": "production-docker-image"}}
    if kind == "ngc":
        tag = "26.09"
        return {"kind": kind, "stands_for": f"nvcr.io/nvidia/vllm:{tag}-py3",
                "vllm": vllm_build or f"{version}+g0c0ffee.nv{tag}",
                "torch": f"{pins['torch']}a0+g0c0ffee.nv{tag}", "flashinfer-python": pins.get("flashinfer-python"),
                "workdir": "/workspace", "entrypoint": ["/opt/nvidia/nvidia_entrypoint.sh"],
                "env": {"NGC_TAG": f"{tag}-py3", "NVIDIA_VLLM_RELEASE": tag}}
    raise ValueError(kind)


def vllm_base_image(c, version: str, *, kind: str = "upstream", extra_run: str = "",
                    vllm_build: str | None = None) -> str:
    """A stand-in base (see above) with the released vLLM ``version`` installed by pip."""
    wheel = vllm_wheel_without_extensions(version)
    layout = standin(kind, version, vllm_build=vllm_build)
    fake = {"torch": layout["torch"], "flashinfer_python": layout["flashinfer-python"]}
    lines = [
        f"FROM {PYTHON_IMAGE}",
        f"COPY {wheel.name} /tmp/",
        f"RUN python3 -m pip install --no-deps --no-index --break-system-packages /tmp/{wheel.name} "
        f"&& rm /tmp/{wheel.name}",
    ]
    if extra_run:
        lines.append(f"RUN {extra_run}")
    setup = [f"sed -i 's/^Version: .*/Version: {layout['vllm']}/' {SITE}/vllm-{version}.dist-info/METADATA"]
    for name, pinned in fake.items():
        if pinned:
            folder = f"{SITE}/{name}-{pinned}.dist-info"
            dist = name.replace("_", "-")
            setup.append(f"mkdir -p {folder} && printf 'Metadata-Version: 2.1\\nName: {dist}\\nVersion: {pinned}\\n' "
                         f"> {folder}/METADATA")
    if kind == "upstream":
        setup.append("echo 'vllm:x:2000:0::/home/vllm:/bin/bash' >> /etc/passwd")
    lines.append("RUN " + " && ".join(setup))
    files = {wheel.name: (wheel.read_bytes(), 0o644), "vllm": (STUB_VLLM.encode(), 0o755)}
    lines.append("COPY vllm /usr/local/bin/vllm")
    if kind == "ngc":
        files["nvidia_entrypoint.sh"] = (NGC_ENTRYPOINT.encode(), 0o755)
        lines.append("COPY nvidia_entrypoint.sh /opt/nvidia/nvidia_entrypoint.sh")
    lines += [f"ENV {k}={v}" for k, v in layout["env"].items()]
    lines += [f"WORKDIR {layout['workdir']}", "ENTRYPOINT " + json.dumps(layout["entrypoint"])]
    files["Dockerfile"] = ("\n".join(lines).encode() + b"\n", 0o644)
    return build_from_files(c, f"vllm-sm12x-test/standin-{kind}", files)


def launcher_wheelhouse() -> Path:
    """Wheels for installing the launcher offline in the python base: its
    dependencies and its build backend, downloaded on the host (pip inside a
    container has no CA bundle; FACTS.md), for that image's Python 3.11."""
    import tomllib

    from launcher.paths import cache_dir

    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    reqs = sorted(project["project"]["dependencies"]) + sorted(project["build-system"]["requires"])
    key = hashlib.sha256("\n".join(reqs).encode()).hexdigest()[:12]
    dest = cache_dir() / "docker-tests" / f"wheelhouse-cp311-x86_64-{key}"
    fill_once(dest / ".complete", lambda: _download_wheelhouse(dest, reqs))
    return dest


def _download_wheelhouse(dest: Path, reqs: list[str]) -> None:
    import subprocess

    dest.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--dest", str(dest), "--only-binary=:all:",
         "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311", "--abi", "abi3", "--abi", "none",
         "--platform", "manylinux_2_36_x86_64", "--platform", "manylinux_2_28_x86_64",
         "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64", "--platform", "any",
         *reqs],
        capture_output=True, text=True,
    )
    if proc.returncode != 0:
        pytest.fail(f"pip download of the launcher's wheels failed:\n{proc.stdout}{proc.stderr}")
    (dest / ".complete").write_text("ok")


def repo_context(extra: dict[str, Path | bytes]) -> io.BytesIO:
    """The repository as the daemon sees it (root .dockerignore applied, through
    the SDK's own filter), plus ``extra`` files at the given context paths."""
    from docker.utils.build import tar as docker_tar

    ignore = [
        line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    base = docker_tar(str(REPO), exclude=ignore)
    buf = io.BytesIO(base.read())
    base.close()
    buf.seek(0, io.SEEK_END)
    with tarfile.open(fileobj=_Rewinder(buf), mode="a") as tf:
        for arcname, item in sorted(extra.items()):
            if isinstance(item, bytes):
                info = tarfile.TarInfo(arcname)
                info.size = len(item)
                info.mode = 0o644
                tf.addfile(info, io.BytesIO(item))
            else:
                tf.add(str(item), arcname=arcname)
    buf.seek(0)
    return buf


class _Rewinder(io.BytesIO):
    """tarfile's append mode wants a file it can read from the start."""

    def __new__(cls, buf: io.BytesIO):
        buf.seek(0)
        return buf


def overlay_inputs(c, base: str, target: str = "sm120") -> dict:
    """What docker/build-image.sh reads off a base before building (launcher image inputs)."""
    from launcher import image
    from launcher.image_cli import inspect_base

    arch = {"sm120": "amd64", "sm121": "arm64"}[target]
    probed, digests, image_id = inspect_base(c, base, pull=False)
    return image.overlay_inputs(base, probed, repo_digests=digests, image_id=image_id, target=target, arch=arch)


def build_overlay(c, base: str, tag: str, buildargs: dict[str, str],
                  vllm_wheel: Path | None = None) -> tuple[str | None, str]:
    """Build docker/Dockerfile.overlay on ``base`` with the classic builder and
    ``buildargs`` (usually :func:`overlay_inputs`' build args); ``vllm_wheel``:
    install that vLLM wheel first (a base without vLLM).

    Returns (image id or None, the build log)."""
    import docker

    wheels = launcher_wheelhouse()
    extra: dict[str, Path | bytes] = {f"docker/wheels/{p.name}": p for p in sorted(wheels.glob("*.whl"))}
    buildargs = {**buildargs, "BASE": base, "PIP_NO_INDEX": "1"}
    if vllm_wheel is not None:
        extra[f"docker/wheels/{vllm_wheel.name}"] = vllm_wheel
        buildargs["VLLM_WHEEL"] = vllm_wheel.name
    log: list[str] = []
    try:
        image, stream = c.images.build(
            fileobj=repo_context(extra), custom_context=True, dockerfile="docker/Dockerfile.overlay",
            tag=tag, rm=True, forcerm=True, buildargs=buildargs,
        )
        log += [chunk.get("stream", "") for chunk in stream]
        return image.id, "".join(log)
    except docker.errors.BuildError as exc:
        text = "".join(log) + build_log_text(exc.build_log)
        remove_failed_build(c, text)
        return None, text
