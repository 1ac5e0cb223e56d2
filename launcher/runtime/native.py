"""Native runtime: run ``vllm serve`` here with the plan's environment.

A supervised child on every OS (not exec): the launcher forwards Ctrl-C and
SIGTERM, returns the child's exit code, and can wait for /health and send a
first chat request. One code path for POSIX and Windows.
"""

from __future__ import annotations

import errno
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

from launcher import progress, redact
from launcher.errors import EXIT_TIMEOUT, LauncherError
from launcher.plan import Plan


def child_env(plan: Plan, base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    for key in plan.env_unset:
        env.pop(key, None)
    env.update(plan.env)
    if plan.api_key:
        env["VLLM_API_KEY"] = plan.api_key  # not on argv: vLLM logs its non-default args
    return env


def command(plan: Plan, argv: list[str] | None = None) -> list[str]:
    """Exactly the interpreter whose vLLM the plan inspected (launcher.vllm_env); a ``ray``
    step (multi-node on Ray) runs the ``ray`` script of that environment."""
    argv = plan.argv if argv is None else argv
    if not plan.vllm_python:
        raise LauncherError("no vLLM to run: the launcher found none to inspect",
                            hint="point --vllm-python at the python that has vLLM, or use --runtime docker")
    if argv[0] == "ray":
        from pathlib import Path

        script = Path(plan.vllm_python).with_name("ray.exe" if os.name == "nt" else "ray")
        return [str(script), *argv[1:]]
    return [plan.vllm_python, "-m", "vllm.entrypoints.cli.main", *argv[1:]]


def run_steps(plan: Plan) -> None:
    """The commands a node runs before its own (``ray start --head`` on a Ray head), each to its end."""
    for step in plan.steps:
        cmd = command(plan, step)
        print("running: " + shlex.join(redact.argv(cmd)), file=sys.stderr, flush=True)
        try:
            code = subprocess.run(cmd, env=child_env(plan)).returncode
        except OSError as exc:
            raise LauncherError(f"cannot run {shlex.join(step[:2])} ({cmd[0]}): {exc.strerror}",
                                hint="install ray beside vLLM on every node: pip install ray") from None
        if code:
            raise LauncherError(f"{shlex.join(step)} failed with exit code {code}", exit_code=code)


# Exit codes of our own, distinct from a child's: 124 like timeout(1).
EXIT_NOT_READY = EXIT_TIMEOUT


def run(plan: Plan, *, wait: bool = False, timeout: float = 1800.0) -> int:
    cmd = command(plan)
    if plan.serves_api:
        ensure_port_free(plan.host, plan.port)
    elif wait:
        # A headless node (or a Ray worker) has no API to wait for: the head's --wait does that.
        print(f"note: node {plan.node_rank} ({plan.role}) serves no API; --wait applies on the head",
              file=sys.stderr, flush=True)
        wait = False
    run_steps(plan)
    try:
        return _serve(plan, cmd, wait, timeout)
    finally:
        _stop_ray_head(plan)


def _stop_ray_head(plan: Plan) -> None:
    """`ray stop` once vLLM has ended on a Ray head this run started (run_steps returned): `ray start
    --head` leaves its daemons running in the background, holding port 6379, and the next start
    on this node would find Ray already running."""
    if not any(step[:3] == ["ray", "start", "--head"] for step in plan.steps):
        return
    cmd = command(plan, ["ray", "stop"])
    print("running: " + shlex.join(cmd), file=sys.stderr, flush=True)
    try:
        code = subprocess.run(cmd, env=child_env(plan)).returncode
    except OSError as exc:
        code = exc.strerror or str(exc)
    if code:
        print(f"warning: `ray stop` did not succeed ({code}): stop Ray on this node by hand", file=sys.stderr, flush=True)


def _serve(plan: Plan, cmd: list[str], wait: bool, timeout: float) -> int:
    print("starting: " + shlex.join(redact.argv(cmd)), file=sys.stderr, flush=True)
    try:
        proc = subprocess.Popen(cmd, env=child_env(plan))
    except OSError as exc:
        raise LauncherError(f"cannot start vLLM ({cmd[0]}): {exc.strerror}", hint="is vLLM installed here?") from None
    received: list[int] = []

    def forward(signum, frame):  # noqa: ARG001
        received.append(signum)
        proc.terminate()

    # SIGTERM (docker stop, systemd), SIGHUP (a closed terminal, a dropped SSH connection) and
    # SIGQUIT (Ctrl-\) sent to the launcher alone would otherwise end it and leave vLLM holding
    # the GPU and the port.
    previous = {sig: signal.signal(sig, forward) for sig in _FORWARDED}
    try:
        if wait and not wait_ready(plan, proc, timeout):
            code = proc.poll()
            if code is None:
                _stop(proc)
            # Not ready is a failure even when vLLM then shuts down cleanly (exit 0).
            code = code if code else EXIT_NOT_READY
        else:
            code = proc.wait()
    except KeyboardInterrupt:
        code = _stop(proc) if not received else proc.wait()
        received = received or [signal.SIGINT]
    except BaseException:
        _stop(proc)  # whatever failed here, the vLLM started here must not outlive the launcher
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return exit_status(code, received[0] if received else None)


#: Signals the launcher passes on to vLLM (as SIGTERM) instead of dying of them.
_FORWARDED = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP", "SIGQUIT") if hasattr(signal, n))


def exit_status(code: int, signum: int | None = None) -> int:
    """The shell's convention: 128+N when the launcher was stopped by signal N, or when vLLM died of one.

    Popen reports a child killed by signal N as -N; passed on as is, sys.exit(-15) exits 241.
    """
    if signum is not None:
        return 128 + int(signum)
    return 128 - code if code < 0 else code


def ensure_port_free(host: str, port: int) -> None:
    """Refuse to start when the address is taken: a server already there would answer /health for us."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise LauncherError(f"--host {host!r} does not resolve: {exc.strerror}") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        if os.name != "nt":
            # As uvicorn does: a port in TIME_WAIT is free, a listening one is not.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            raise _bind_error(host, port, exc) from None


def _bind_error(host: str, port: int, exc: OSError) -> LauncherError:
    """Why vLLM could not listen at host:port, as the system said it (not every refusal is a port in use)."""
    if exc.errno == errno.EADDRNOTAVAIL:
        return LauncherError(f"--host {host} is not an address of this machine ({exc.strerror}); vLLM could not listen there",
                             hint="use 127.0.0.1 (this machine only), 0.0.0.0 (every interface) or one of its own addresses")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return LauncherError(f"{host}:{port}: not allowed to listen there ({exc.strerror})",
                             hint="ports below 1024 need privileges: pass a --port of 1024 or more")
    return LauncherError(
        f"{host}:{port} is already in use ({exc.strerror}); vLLM could not listen there",
        hint=f"stop the server on port {port} (is an earlier vLLM still running?) or pass another --port",
    )


def _stop(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        # POSIX: SIGINT lets vLLM shut its engine core down cleanly. Windows:
        # the console already delivered Ctrl-C to the child; terminate the rest.
        if os.name == "nt":
            proc.terminate()
        else:
            proc.send_signal(signal.SIGINT)
        try:
            return proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()


def base_url(plan: Plan) -> str:
    host = "127.0.0.1" if plan.host in ("0.0.0.0", "::") else plan.host
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{plan.port}"


def _secrets(plan: Plan) -> list[str]:
    """Every secret value the launcher knows of: the API key, and secret-named variables."""
    env = {**os.environ, **plan.env}
    return [v for v in [plan.api_key, *(v for k, v in env.items() if redact.is_secret_name(k))] if v]


def wait_ready(plan: Plan, proc: subprocess.Popen | None, timeout: float) -> bool:
    """Poll /health until the child answers, then send one small chat request.

    A 200 counts only when the listening socket belongs to ``proc`` (or a
    process it started): another server on the port must never pass for ours.
    """
    url = base_url(plan)
    with progress.Waiting(f"waiting for vLLM at {url}/health", timeout) as waiting:
        while not waiting.expired():
            if proc is not None and proc.poll() is not None:
                waiting.fail(f"vLLM exited with code {proc.returncode} before it was ready")
                return False
            if _healthy(url):
                owner = listener_owned_by(proc, plan.port) if proc is not None else True
                if owner is False:
                    waiting.fail(f"another process answers {url}/health: the vLLM started here "
                                 f"(pid {proc.pid}) does not listen on port {plan.port}")
                    return False
                if proc is None or proc.poll() is None:
                    break
                continue  # it exited meanwhile: the check at the top reports it
            time.sleep(1)
        else:
            # the caller stops it next: say so, and that a first start can outlast a short wait
            waiting.fail(f"vLLM did not answer {url}/health within {timeout:g} s; stopping it. A first start "
                         "compiles and captures CUDA graphs for minutes (a drafter server on a fresh host took "
                         "about 7): raise --timeout (default 1800 s), or serve without --wait")
            return False
        ready_s = waiting.elapsed()
    # The reply is the server's text: one that echoes the request's headers must not print the key.
    reply = redact.text(first_chat(plan, url), _secrets(plan))
    print(f"ready in {ready_s:.1f} s: {url}/v1  (first reply: {reply!r})", flush=True)
    return True


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def listener_owned_by(proc: subprocess.Popen, port: int) -> bool | None:
    """True when ``proc`` or a descendant listens on ``port``; None when the OS will not say."""
    try:
        import psutil

        root = psutil.Process(proc.pid)
        family = [root, *root.children(recursive=True)]
        for p in family:
            for conn in p.net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
                    return True
        return False
    except ImportError:
        return None
    except Exception:  # psutil.AccessDenied (macOS); NoSuchProcess: its exit is seen at the next poll
        return None


def first_chat(plan: Plan, url: str) -> str:
    names = _served_names(plan.argv)
    body = json.dumps({"model": names[0] if names else str(plan.model),
                       "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8}).encode()
    headers = {"Content-Type": "application/json"}
    if plan.api_key:
        headers["Authorization"] = f"Bearer {plan.api_key}"
    req = urllib.request.Request(f"{url}/v1/chat/completions", data=body, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            data = json.load(resp)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return f"<chat request failed: {exc}>"
    return _reply_text(data)


def _reply_text(data: object) -> str:
    """The first choice's message, or what the reply was instead (a server may answer in any shape)."""
    choices = data.get("choices") if isinstance(data, dict) else None
    choice = choices[0] if isinstance(choices, list) and choices else None
    message = choice.get("message") if isinstance(choice, dict) else None
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, str):
        return content
    return f"<unexpected chat reply: {json.dumps(data)[:200]}>"


def _served_names(argv: list[str]) -> list[str]:
    if "--served-model-name" not in argv:
        return []
    names = []
    for arg in argv[argv.index("--served-model-name") + 1:]:
        if arg.startswith("--"):
            break
        names.append(arg)
    return names
