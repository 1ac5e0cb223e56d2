"""Docker runtime: run a Plan's ``vllm serve`` in a container, through the Docker SDK.

Two halves, kept apart on purpose:

* :func:`container_spec` turns a Plan into a plain, JSON-friendly description of
  the container (image, name, command, env, ports, mounts, GPU request, ...).
  It is pure — no daemon, no filesystem writes — so ``serve --dry-run`` can
  print exactly what would run on a machine without Docker. Secret values never
  enter the spec: it only names them (``secret_env``), and :func:`run` reads
  the values from the Plan when it creates the container.
* :func:`run` carries a spec out on a daemon: create, start, stream the log,
  wait for ``/health``, print the endpoint, wait for the container to end.
  Whatever happens (startup crash, timeout, Ctrl-C, SIGTERM, a daemon refusal)
  the container is removed: a stable name must be free for the next start.

The server inside always binds 0.0.0.0:8000; the host side is published on the
Plan's host (127.0.0.1 unless ``--host`` says otherwise) and port. Host paths
in the vLLM command line (target, drafter) are rewritten to where they are
mounted inside the container.
"""

from __future__ import annotations

import collections
import ipaddress
import json
import os
import shlex
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from launcher import interrupts, redact
from launcher.errors import EXIT_TIMEOUT, LauncherError
from launcher.paths import models_dir
from launcher.plan import LocalImage, Plan, flag_groups

CONTAINER_PORT = 8000
MODELS_MOUNT = "/models"
# HF_HOME inside the container: independent of the image's user and home.
HF_HOME_MOUNT = "/cache/huggingface"
LABEL = "org.vllm-sm12x"
NAME_PREFIX = "vllm-sm12x-"
# docker run --gpus all sends exactly this request.
GPU_REQUEST = {"driver": "", "count": -1, "device_ids": None, "capabilities": [["gpu"]]}
# docker run --restart: "no" runs in the foreground and removes the container
# when it ends; the others leave it to the daemon (it comes back after a reboot).
RESTART_POLICIES = ("no", "unless-stopped", "always", "on-failure")
LOG_TAIL_LINES = 30
STOP_TIMEOUT_S = 30
PROGRESS_EVERY_S = 10.0


# --- the spec (pure) -----------------------------------------------------------


def container_name(recipe: str) -> str:
    """Stable per recipe, so a second start finds (and refuses or clears) the first."""
    safe = "".join(c if c.isalnum() or c in "_.-" else "-" for c in recipe).strip("-.") or "recipe"
    return NAME_PREFIX + safe


def container_spec(plan: Plan, *, gpus: str | None = "all", restart: str = "no") -> dict[str, Any]:
    """The container a Plan runs in, as plain data (see the module docstring).

    ``gpus``: "all" requests every GPU (``docker run --gpus all``); None requests
    none (only tests on a GPU-less daemon use that). ``restart``: a docker
    restart policy (RESTART_POLICIES); anything but "no" leaves the container
    running after the launcher returns (``launcher ps`` / ``launcher stop``).
    """
    if gpus not in ("all", None):
        raise ValueError(f"gpus must be 'all' or None, not {gpus!r}")
    if restart not in RESTART_POLICIES:
        raise LauncherError(f"--restart {restart!r} is not a docker restart policy",
                            hint="use " + ", ".join(RESTART_POLICIES))
    if not plan.image:
        raise LauncherError("the docker runtime needs an image", hint="pass --image IMAGE")
    if not plan.argv[:2] == ["vllm", "serve"]:
        raise LauncherError(f"the plan's command must start with 'vllm serve', got {plan.argv[:2]}")
    host_ip = _publish_ip(plan.host)
    # Multi-node: host networking, so that NCCL, Gloo and the head's torch.distributed port reach
    # the other node over the host's own interface (the QSFP link) and vLLM binds --host itself.
    cluster = plan.cluster is not None
    mounts, path_map = _model_mounts(plan)
    # Every model a local folder: nothing to download, the HF cache can be read-only.
    all_local = all(_host_path(p) is not None for p in _model_args(plan))
    hf = _hf_cache_mount(read_only=all_local)
    if hf is None and not all_local:
        # A download is coming: keep it in the host's cache (made at start) rather than in the container.
        hf = {**_mount(_hf_home(), HF_HOME_MOUNT, read_only=False), "create": True}
    env = {k: v for k, v in sorted(plan.env.items()) if not redact.is_secret_name(k)}
    secret_env = sorted(k for k in plan.env if redact.is_secret_name(k))
    if plan.api_key and "VLLM_API_KEY" not in secret_env:
        secret_env.append("VLLM_API_KEY")
    env["HF_HOME"] = HF_HOME_MOUNT
    if hf is not None:
        mounts.append(hf)
        if hf["read_only"]:
            # trust_remote_code copies model code into HF_HOME/modules; keep that writable.
            env["HF_MODULES_CACHE"] = "/tmp/hf_modules"
    api = plan.serves_api
    endpoint = f"http://{_probe_host(host_ip)}:{plan.port}/v1" if api else ""
    labels = {
        f"{LABEL}.managed-by": "launcher",
        f"{LABEL}.recipe": plan.recipe,
        f"{LABEL}.profile": plan.profile,
        f"{LABEL}.vllm-version": plan.vllm_version,
        f"{LABEL}.endpoint": endpoint,
    }
    if cluster:
        labels[f"{LABEL}.node-role"] = plan.role
        labels[f"{LABEL}.node-rank"] = str(plan.node_rank)
        labels[f"{LABEL}.nnodes"] = str(plan.cluster["nnodes"])
    return {
        "image": plan.image,
        "name": container_name(plan.recipe) + (f"-node{plan.node_rank}" if cluster else ""),
        "command": _container_argv(plan.argv, path_map, bind=not cluster),
        "env": env,
        "secret_env": secret_env,
        "network_mode": "host" if cluster else "bridge",
        "ports": {} if cluster else {f"{CONTAINER_PORT}/tcp": [host_ip, plan.port]},
        "mounts": mounts,
        "device_requests": [dict(GPU_REQUEST)] if gpus == "all" else [],
        "ipc_mode": "host",  # vLLM's workers share tensors through /dev/shm
        "restart": restart,
        "labels": labels,
        "health_url": f"http://{_probe_host(host_ip)}:{plan.port}/health" if api else None,
        "endpoint": endpoint,
    }


def _published(spec: dict[str, Any]) -> tuple[str, int] | None:
    """(host address, host port) the API is published on; None with host networking."""
    ports = spec["ports"].get(f"{CONTAINER_PORT}/tcp")
    return (ports[0], ports[1]) if ports else None


def _publish_ip(host: str) -> str:
    if host == "localhost":
        return "127.0.0.1"
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        raise LauncherError(
            f"--host {host!r}: the docker runtime publishes on an IP address",
            hint="use 127.0.0.1 (this machine only) or 0.0.0.0 (every interface, set --api-key)",
        ) from None


def _probe_host(host_ip: str) -> str:
    if host_ip in ("0.0.0.0", "::"):
        return "127.0.0.1"
    return f"[{host_ip}]" if ":" in host_ip else host_ip


def _model_args(plan: Plan) -> list[Path]:
    return [p for p in (plan.model, plan.drafter) if p is not None]


def _host_path(path: Path) -> Path | None:
    """A model argument as an absolute host folder; None for a Hub id (``google/gemma-4-…``)."""
    path = Path(path).expanduser()
    if path.is_absolute() or path.exists():
        return Path(os.path.abspath(path))
    return None


def _model_mounts(plan: Plan) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Read-only mounts for the model folders, and host path -> container path.

    The common case (both under the models folder) mounts that folder at
    /models, as the image's documentation does. A folder elsewhere gets its own
    mount at /models/<name> instead, and then nothing else sits at /models (a
    bind mount nested in a read-only bind mount would need a host mkdir).
    """
    hosts = [h for h in map(_host_path, _model_args(plan)) if h is not None]
    originals = {str(p): p for p in _model_args(plan)}
    if not hosts:
        return [], {}
    root = Path(os.path.abspath(models_dir()))
    path_map: dict[str, str] = {}
    mounts: list[dict[str, Any]] = []
    if all(_is_under(p, root) for p in hosts):
        mounts.append(_mount(root, MODELS_MOUNT, read_only=True))
        for p in hosts:
            path_map[str(p)] = f"{MODELS_MOUNT}/{p.relative_to(root).as_posix()}".rstrip("/")
    else:
        used: set[str] = set()
        for p in hosts:
            name = p.name or "model"
            while name in used:
                name += "_"
            used.add(name)
            target = f"{MODELS_MOUNT}/{name}"
            mounts.append(_mount(p, target, read_only=True))
            path_map[str(p)] = target
    # The Plan's argv carries the paths as the user wrote them (maybe relative).
    for text, p in originals.items():
        resolved = _host_path(p)
        if resolved is not None and str(resolved) in path_map:
            path_map.setdefault(text, path_map[str(resolved)])
    return mounts, path_map


def _is_under(path: Path, root: Path) -> bool:
    try:
        path.relative_to(root)
    except ValueError:
        return False
    return path != root


def _mount(source: Path, target: str, *, read_only: bool) -> dict[str, Any]:
    return {"type": "bind", "source": str(source), "target": target, "read_only": read_only}


def _hf_home() -> Path:
    """The host's HF_HOME as huggingface_hub resolves it (token, hub cache, modules)."""
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache"), "huggingface"
    )
    return Path(os.path.abspath(Path(home).expanduser()))


def _hf_cache_mount(*, read_only: bool) -> dict[str, Any] | None:
    """The host's Hugging Face cache (with the hub login's token), read-only
    unless a model must be downloaded."""
    home = _hf_home()
    if not home.is_dir():
        return None
    return _mount(home, HF_HOME_MOUNT, read_only=read_only)


def _container_argv(argv: list[str], path_map: dict[str, str], *, bind: bool = True) -> list[str]:
    """The Plan's vLLM argv with container paths, binding 0.0.0.0:8000 inside (``bind``); with
    host networking (``bind`` False) the plan's own --host / --port stay."""
    out: list[str] = []
    skip = False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        flag, eq, value = arg.partition("=")
        if bind and flag in ("--host", "--port"):
            skip = not eq and i + 1 < len(argv)
            continue
        if eq and flag.startswith("--"):
            out.append(f"{flag}={_map_value(value, path_map)}")
        else:
            out.append(_map_value(arg, path_map))
    return out + (["--host", "0.0.0.0", "--port", str(CONTAINER_PORT)] if bind else [])


def _map_value(value: str, path_map: dict[str, str]) -> str:
    if value in path_map:
        return path_map[value]
    if value.startswith("{"):
        # --speculative-config '{"model": "/host/path", ...}'
        try:
            data = json.loads(value)
        except ValueError:
            return value
        mapped = _map_json(data, path_map)
        if mapped != data:
            return json.dumps(mapped, separators=(",", ":"))
    return value


def _map_json(data: Any, path_map: dict[str, str]) -> Any:
    if isinstance(data, dict):
        return {k: _map_json(v, path_map) for k, v in data.items()}
    if isinstance(data, list):
        return [_map_json(v, path_map) for v in data]
    if isinstance(data, str):
        return path_map.get(data, data)
    return data


def format_container_spec(spec: dict[str, Any]) -> str:
    """Human-readable spec for --dry-run, with an equivalent ``docker run`` line.

    Secrets are shown as ``NAME=***``: the spec never holds their values.
    """
    published = _published(spec)
    if published:
        host_ip, host_port = published
        network = f"  publish     {host_ip}:{host_port} -> {CONTAINER_PORT}/tcp  (vLLM binds 0.0.0.0:{CONTAINER_PORT} inside)"
    else:
        network = ("  network     host  (the node's own interfaces: NCCL, Gloo and the head's ports reach the "
                   "other nodes; vLLM binds its --host itself)")
    lines = [
        f"  image       {spec['image']}",
        f"  name        {spec['name']}",
        network,
        f"  gpus        {'all (device request: capabilities [[gpu]])' if spec['device_requests'] else 'none'}",
        f"  ipc         {spec['ipc_mode']}",
        f"  restart     {spec['restart']}"
        + ("  (foreground; removed when it ends)" if spec["restart"] == "no" else "  (detached; launcher ps / launcher stop)"),
    ]
    for i, m in enumerate(spec["mounts"]):
        head = "  mounts      " if i == 0 else "              "
        lines.append(f"{head}{m['source']} -> {m['target']} ({'ro' if m['read_only'] else 'rw'})")
    if not spec["mounts"]:
        lines.append("  mounts      none")
    env_items = [f"{k}={v}" for k, v in redact.env(spec["env"]).items()]
    env_items += [f"{k}={redact.MASK}" for k in spec["secret_env"]]
    for i, item in enumerate(env_items):
        lines.append(("  env         " if i == 0 else "              ") + item)
    lines.append("  health      " + (spec["health_url"] or "none: a headless node serves no API"))
    # The one place the command is shown: as `docker run` would start it.
    lines.append("  as docker run:")
    lines.append("    " + " \\\n      ".join(_docker_run_groups(spec)))
    return "\n".join(lines)


def starting_line(spec: dict[str, Any]) -> str:
    """The container about to start, as one `docker run` line (what the native runtime's
    ``starting:`` line is for a local vLLM)."""
    return " ".join(_docker_run_groups(spec))


def _docker_run_groups(spec: dict[str, Any]) -> list[str]:
    published = _published(spec)
    keep = "--rm" if spec["restart"] == "no" else f"-d --restart {spec['restart']}"
    groups = [f"docker run {keep} --name {shlex.quote(spec['name'])}"]
    if spec["device_requests"]:
        groups.append("--gpus all")
    if published:
        groups.append(f"--ipc={spec['ipc_mode']} -p {published[0]}:{published[1]}:{CONTAINER_PORT}")
    else:
        groups.append(f"--ipc={spec['ipc_mode']} --network host")
    for m in spec["mounts"]:
        groups.append("-v " + shlex.quote(f"{m['source']}:{m['target']}" + (":ro" if m["read_only"] else "")))
    for k, v in redact.env(spec["env"]).items():
        groups.append("-e " + shlex.quote(f"{k}={v}"))
    for k in spec["secret_env"]:
        # Never written out, so it comes from the shell that runs the line. A bare `-e NAME`
        # passes nothing where the shell lacks it (a key given with --api-key), and vLLM would
        # serve with no key: the shell refuses to run the line instead.
        groups.append(f'-e "{k}=${{{k}:?export {k} first: the launcher never prints it}}"')
    groups.append(shlex.quote(spec["image"]))
    groups.extend(flag_groups(redact.argv(spec["command"])))
    return groups


def image_hint(plan: Plan) -> str:
    """How to get the image a Plan names: build it (source: hours; overlay on the
    upstream release image: minutes, tagged ``-overlay``). No vllm-sm12x image is
    published, so there is nothing to pull."""
    from launcher.profiles import PROFILES

    profile = PROFILES.get(plan.profile)
    target = profile.sm.replace("_", "") if profile else "sm120"
    arch = profile.platform.split("/")[1] if profile else "amd64"
    make_args = f"VLLM_VERSION={plan.vllm_version} TARGET={target}"
    overlay = f"vllm-sm12x:{plan.vllm_version}-{target}-{arch}-overlay"
    return (
        f"build it from source: make image {make_args} (hours); or patch the upstream vLLM image: "
        f"make image-overlay {make_args} (minutes; without --image the plan takes the newest image built for "
        f"this card, or pass --image {overlay})"
    )


# --- carrying it out (daemon) ------------------------------------------------


def connect(timeout: float = 60):
    """A Docker SDK client, or a LauncherError that says how to get a daemon."""
    import docker

    where = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    try:
        client = docker.from_env(timeout=timeout)
        client.ping()
    except (docker.errors.DockerException, ValueError, OSError) as exc:  # ValueError: a DOCKER_HOST it cannot parse
        raise LauncherError(
            f"cannot reach the Docker daemon at {where}: {_short(exc)}",
            hint="start it (sudo systemctl start docker) or point DOCKER_HOST at one; "
            "without Docker use --runtime native",
        ) from None
    return client


def run(
    plan: Plan,
    *,
    wait_timeout: float = 1800.0,
    client=None,
    gpus: str | None = "all",
    restart: str = "no",
    out=None,
    err=None,
) -> int:
    """Run the Plan in a container; return the container's exit code.

    Raises LauncherError for every failure before the server is healthy, after
    removing the container. Ctrl-C stops and removes it and returns 130;
    SIGTERM, SIGHUP and SIGQUIT do the same and return 128+N. With a ``restart`` policy other than "no" the container is
    left running once healthy (the daemon restarts it, after a reboot too) and
    this returns 0; ``launcher stop`` ends it.
    """
    out = out or sys.stdout
    err = err or sys.stderr
    spec = container_spec(plan, gpus=gpus, restart=restart)
    client = client or connect()
    _require_image(client, spec["image"], plan)
    _require_mount_sources(spec)
    _clear_stale(client, spec["name"])
    print("starting: " + starting_line(spec), file=err, flush=True)
    secrets = [v for v in (plan.api_key, *(plan.env.get(k) for k in spec["secret_env"]),
                           *redact.argv_secrets(plan.argv)) if v]
    container = None
    logs = None
    detached = False
    # SIGTERM, SIGHUP and SIGQUIT take the Ctrl-C path, so a killed launcher still removes its container.
    restore = interrupts.install()
    try:
        container = create(client, spec, environment(plan, spec))
        logs = _LogPump(container, out, secrets)
        _start(container, spec)
        logs.start()
        started = time.monotonic()
        if spec["health_url"] is None:
            # A headless node: nothing to wait for; it lives as long as the head does.
            print(f"started container {spec['name']}: this node serves no API (the head does); "
                  + ("it keeps running: `launcher ps`, `launcher stop`" if spec["restart"] != "no"
                     else "Ctrl-C stops and removes it"), file=err, flush=True)
            if spec["restart"] != "no":
                detached = True
                return 0
            code = int(container.wait().get("StatusCode", 1))
            logs.join(5)
            print(f"container {spec['name']} exited with code {code}", file=err, flush=True)
            return code
        _wait_healthy(container, spec, logs, wait_timeout, err)
        if spec["restart"] != "no":
            detached = True
            print(
                f"ready in {time.monotonic() - started:.1f} s: {spec['endpoint']}  (container {spec['name']}, "
                f"restart {spec['restart']}: it keeps running and comes back with the Docker daemon; "
                f"`launcher ps` shows it, `launcher stop {spec['name']}` ends it)",
                file=err,
                flush=True,
            )
            return 0
        print(
            f"ready in {time.monotonic() - started:.1f} s: {spec['endpoint']}  "
            f"(container {spec['name']}; Ctrl-C stops and removes it)",
            file=err,
            flush=True,
        )
        code = int(container.wait().get("StatusCode", 1))
        logs.join(5)
        print(f"container {spec['name']} exited with code {code}", file=err, flush=True)
        return code
    except (KeyboardInterrupt, interrupts.Signalled) as exc:
        print(f"\nstopping container {spec['name']} ...", file=err, flush=True)
        if container is not None:
            _stop(container)
        return exc.exit_status if isinstance(exc, interrupts.Signalled) else 130
    finally:
        restore()
        if detached:
            pass  # the daemon keeps it; launcher stop removes it
        elif container is not None:
            _remove(container)
        else:
            # Interrupted inside create(): the daemon may have made it anyway.
            _remove_created(client, spec["name"])
        if logs is not None and not detached:
            logs.join(2)


def environment(plan: Plan, spec: dict[str, Any]) -> dict[str, str]:
    """The container's full environment: the spec's env plus the secret values."""
    env = dict(spec["env"])
    for key in spec["secret_env"]:
        if key in plan.env:
            env[key] = plan.env[key]
    if plan.api_key:
        env["VLLM_API_KEY"] = plan.api_key  # not on argv: vLLM logs its non-default args
    return env


def create(client, spec: dict[str, Any], env: dict[str, str]):
    """Create (not start) the container a spec describes."""
    import docker
    from docker.types import DeviceRequest, Mount

    published = _published(spec)
    network = {"network_mode": "host"} if spec.get("network_mode") == "host" else \
        {"ports": {f"{CONTAINER_PORT}/tcp": published}}
    try:
        return client.containers.create(
            spec["image"],
            command=spec["command"],
            name=spec["name"],
            environment=env,
            **network,
            mounts=[
                Mount(target=m["target"], source=m["source"], type=m["type"], read_only=m["read_only"])
                for m in spec["mounts"]
            ],
            device_requests=[
                DeviceRequest(driver=d["driver"], count=d["count"], device_ids=d["device_ids"], capabilities=d["capabilities"])
                for d in spec["device_requests"]
            ],
            ipc_mode=spec["ipc_mode"],
            restart_policy={"Name": spec["restart"]} if spec["restart"] != "no" else None,
            labels=spec["labels"],
            detach=True,
        )
    except docker.errors.APIError as exc:
        raise _daemon_error(exc, spec) from None


def local_images(client) -> list[LocalImage]:
    """Every tag the daemon has, described by the vllm-sm12x labels where an image
    carries them (docker/Dockerfile and Dockerfile.overlay set them): what the plan
    picks its default image from and checks --image against."""
    found = []
    for img in client.images.list():
        labels = img.labels or {}
        for tag in img.tags:
            found.append(LocalImage(tag=tag, vllm_version=labels.get(f"{LABEL}.vllm-version") or None,
                                    target=labels.get(f"{LABEL}.target") or None,
                                    arch=labels.get(f"{LABEL}.arch") or None,
                                    created=str(img.attrs.get("Created") or "")))
    return found


def _require_image(client, image: str, plan: Plan) -> None:
    import docker

    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        raise LauncherError(f"image {image} is not on this machine", hint=image_hint(plan)) from None
    except docker.errors.APIError as exc:
        raise LauncherError(f"the Docker daemon could not look up image {image}: {_short(exc)}") from None


def _require_mount_sources(spec: dict[str, Any]) -> None:
    for m in spec["mounts"]:
        if m.get("create"):
            Path(m["source"]).mkdir(parents=True, exist_ok=True)
        if not Path(m["source"]).exists():
            raise LauncherError(
                f"{m['source']} does not exist (it would be mounted at {m['target']})",
                hint="download or quantize the model there, or pass --model / --drafter",
            )


def _clear_stale(client, name: str) -> None:
    """A stopped container of ours under the stable name is leftover: remove it.
    A running one, or someone else's, is not ours to touch."""
    import docker

    try:
        old = client.containers.get(name)
    except docker.errors.NotFound:
        return
    ours = old.labels.get(f"{LABEL}.managed-by") == "launcher"
    if ours and old.status not in ("running", "restarting", "paused"):
        old.remove(force=True)
        return
    what = "is already running" if old.status == "running" else f"exists ({old.status})"
    raise LauncherError(
        f"a container named {name} {what}" + ("" if ours else " and was not started by the launcher"),
        hint=f"stop it first: launcher stop {name}" if ours else f"stop it first: docker rm -f {name}",
    )


def _start(container, spec: dict[str, Any]) -> None:
    import docker

    try:
        container.start()
    except docker.errors.APIError as exc:
        raise _daemon_error(exc, spec) from None


def _daemon_error(exc, spec: dict[str, Any]) -> LauncherError:
    text = _short(exc)
    lowered = text.lower()
    host_ip, host_port = _published(spec) or ("(host network)", "vLLM's")
    if "could not select device driver" in lowered:
        return LauncherError(
            "the Docker daemon cannot give the container a GPU: the NVIDIA runtime is not set up "
            f"(daemon: {text})",
            hint="install the NVIDIA Container Toolkit (package nvidia-container-toolkit), then "
            "`sudo nvidia-ctk runtime configure --runtime=docker` and restart the Docker daemon",
        )
    if "port is already allocated" in lowered or "address already in use" in lowered:
        return LauncherError(
            f"port {host_ip}:{host_port} is already in use (daemon: {text})",
            hint="stop whatever listens there, or pass --port with a free port",
        )
    return LauncherError(f"the Docker daemon refused the container: {text}")


def _short(exc: Exception) -> str:
    explanation = getattr(exc, "explanation", None)
    text = explanation if isinstance(explanation, str) and explanation else str(exc)
    return " ".join(text.split())


def _wait_healthy(container, spec: dict[str, Any], logs: "_LogPump", timeout: float, err) -> None:
    """Poll /health until it answers 200; the container ending first, or the
    timeout, is an error that carries the last log lines."""
    import docker

    started = time.monotonic()
    next_progress = started + PROGRESS_EVERY_S
    print(f"waiting for {spec['health_url']} (timeout {timeout:g} s)", file=err, flush=True)
    while True:
        try:
            container.reload()
        except docker.errors.NotFound:
            raise LauncherError(f"container {spec['name']} disappeared during startup") from None
        if container.status in ("exited", "dead"):
            code = int(container.attrs.get("State", {}).get("ExitCode", 1))
            logs.join(5)
            raise LauncherError(
                f"container {spec['name']} exited with code {code} during startup; last log lines:\n"
                + logs.tail_text(),
                hint="the lines above come from vLLM inside the container",
                exit_code=code or 1,
            )
        if _healthy(spec["health_url"]):
            return
        now = time.monotonic()
        if now - started >= timeout:
            raise LauncherError(
                f"no answer from {spec['health_url']} within {timeout:g} s; last log lines:\n" + logs.tail_text(),
                hint="a first start compiles kernels and can take long: raise --timeout",
                exit_code=EXIT_TIMEOUT,
            )
        if now >= next_progress:
            print(f"  ... still starting ({now - started:.0f} s of {timeout:g} s)", file=err, flush=True)
            next_progress = now + PROGRESS_EVERY_S
        time.sleep(0.5)


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _stop(container) -> None:
    import docker

    try:
        container.stop(timeout=STOP_TIMEOUT_S)
    except docker.errors.APIError:
        pass  # already gone or stopping: removal below forces it


def _remove(container) -> None:
    import docker

    try:
        container.remove(force=True)
    except docker.errors.NotFound:
        pass
    except docker.errors.APIError as exc:
        if "already in progress" not in _short(exc):
            raise


def _remove_created(client, name: str) -> None:
    import docker

    try:
        leftover = client.containers.get(name)
    except docker.errors.DockerException:
        return
    if leftover.labels.get(f"{LABEL}.managed-by") == "launcher" and leftover.status == "created":
        _remove(leftover)


# --- what the launcher started: launcher ps / launcher stop --------------------


def managed(client, *, running_only: bool = False) -> list:
    """Containers the launcher started (found by its label), oldest first."""
    found = client.containers.list(all=not running_only, filters={"label": f"{LABEL}.managed-by=launcher"})
    return sorted(found, key=lambda c: c.attrs.get("Created", ""))


def describe(container) -> dict[str, Any]:
    """One row of ``launcher ps``."""
    labels = container.labels
    host = container.attrs.get("HostConfig", {})
    return {
        "name": container.name,
        "status": container.status,
        "recipe": labels.get(f"{LABEL}.recipe", ""),
        "vllm": labels.get(f"{LABEL}.vllm-version", ""),
        "image": (container.attrs.get("Config") or {}).get("Image", ""),
        "restart": (host.get("RestartPolicy") or {}).get("Name") or "no",
        "endpoint": labels.get(f"{LABEL}.endpoint", ""),
        # Multi-node: head (serves the API) or worker, with the node's rank; one machine: single.
        "role": (f"{labels[f'{LABEL}.node-role']} {labels.get(f'{LABEL}.node-rank', '?')}/"
                 f"{labels.get(f'{LABEL}.nnodes', '?')}" if labels.get(f"{LABEL}.node-role") else "single"),
    }


def stop_managed(client, names: list[str], *, every: bool = False, err=None) -> list[str]:
    """Stop and remove launcher containers, by container name or recipe; the names stopped.

    A name that is not a launcher container is refused before anything stops.
    """
    import docker

    err = err or sys.stderr
    ours = {c.name: c for c in managed(client)}
    if every:
        chosen = list(ours.values())
    else:
        chosen = []
        for name in names:
            match = ours.get(name) or ours.get(container_name(name))
            if match is None:
                try:
                    client.containers.get(name)
                    why = f"container {name} was not started by the launcher"
                except docker.errors.NotFound:
                    why = f"no launcher container named {name} (or for recipe {name})"
                raise LauncherError(why, hint="launcher ps lists what the launcher started"
                                    + (f": {', '.join(ours)}" if ours else "; nothing now"))
            chosen.append(match)
    for container in chosen:
        print(f"stopping {container.name} ...", file=err, flush=True)
        _stop(container)
        _remove(container)
    return [c.name for c in chosen]


class _LogPump:
    """Follows the container's log in a thread: prints it (secrets masked) and
    keeps the last lines for error messages."""

    def __init__(self, container, out, secrets: list[str]):
        self._container = container
        self._out = out
        self._secrets = secrets
        self._tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)
        self._thread = threading.Thread(target=self._pump, name="docker-logs", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float) -> None:
        if self._thread.is_alive():
            self._thread.join(timeout)

    def tail_text(self) -> str:
        return "\n".join(f"  | {line}" for line in self._tail) or "  (no output)"

    def _pump(self) -> None:
        pending = b""
        try:
            for chunk in self._container.logs(stream=True, follow=True):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for raw in lines:
                    self._emit(raw)
        except Exception:  # noqa: BLE001 - the container went away; the main thread reports why
            pass
        if pending:
            self._emit(pending)

    def _emit(self, raw: bytes) -> None:
        line = redact.text(raw.decode("utf-8", "replace").rstrip("\r"), self._secrets)
        self._tail.append(line)
        try:
            print(line, file=self._out, flush=True)
        except ValueError:
            pass  # output closed at exit
