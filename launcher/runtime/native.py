"""Native runtime: run ``vllm serve`` here with the plan's environment.

A supervised child on every OS (not exec): the launcher forwards Ctrl-C and
SIGTERM, returns the child's exit code, and can wait for /health and send a
first chat request. One code path for POSIX and Windows.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

from launcher.errors import LauncherError
from launcher.plan import Plan


def child_env(plan: Plan, base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    for key in plan.env_unset:
        env.pop(key, None)
    env.update(plan.env)
    if plan.api_key:
        env["VLLM_API_KEY"] = plan.api_key  # not on argv: vLLM logs its non-default args
    return env


def command(plan: Plan) -> list[str]:
    exe = shutil.which("vllm")
    if exe:
        return [exe, *plan.argv[1:]]
    return [sys.executable, "-m", "vllm.entrypoints.cli.main", *plan.argv[1:]]


def run(plan: Plan, *, wait: bool = False, timeout: float = 1800.0) -> int:
    cmd = command(plan)
    try:
        proc = subprocess.Popen(cmd, env=child_env(plan))
    except OSError as exc:
        raise LauncherError(f"cannot start vLLM ({cmd[0]}): {exc.strerror}", hint="is vLLM installed here?") from None
    previous = signal.signal(signal.SIGTERM, lambda *_: proc.terminate())
    try:
        if wait:
            ready = wait_ready(plan, proc, timeout)
            if not ready:
                return proc.poll() if proc.poll() is not None else _stop(proc)
        return proc.wait()
    except KeyboardInterrupt:
        return _stop(proc)
    finally:
        signal.signal(signal.SIGTERM, previous)


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
    return f"http://{host}:{plan.port}"


def wait_ready(plan: Plan, proc: subprocess.Popen | None, timeout: float) -> bool:
    """Poll /health, then send one small chat request; print the endpoint and time to ready."""
    start = time.monotonic()
    url = base_url(plan)
    while time.monotonic() - start < timeout:
        if proc is not None and proc.poll() is not None:
            print(f"vLLM exited with code {proc.returncode} before it was ready", file=sys.stderr)
            return False
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
                if resp.status == 200:
                    break
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(1)
    else:
        print(f"vLLM did not answer {url}/health within {timeout:g} s", file=sys.stderr)
        return False
    ready_s = time.monotonic() - start
    reply = first_chat(plan, url)
    print(f"ready in {ready_s:.1f} s: {url}/v1  (first reply: {reply!r})", flush=True)
    return True


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
        return data["choices"][0]["message"]["content"]
    except (urllib.error.URLError, OSError, KeyError, ValueError) as exc:
        return f"<chat request failed: {exc}>"


def _served_names(argv: list[str]) -> list[str]:
    if "--served-model-name" not in argv:
        return []
    names = []
    for arg in argv[argv.index("--served-model-name") + 1:]:
        if arg.startswith("--"):
            break
        names.append(arg)
    return names
