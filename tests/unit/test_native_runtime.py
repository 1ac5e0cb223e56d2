"""The native runtime starts a real child process with the plan's env.

vLLM cannot serve here (no GPU): a stand-in ``vllm`` package in a real venv
plays it (tests/unit/fake_vllm_env.py). Everything else is real: finding and
inspecting the interpreter, the port check, the process start, env merge,
health wait, ownership of the listening socket, chat request, exit codes.
"""

from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from launcher import vllm_env
from launcher.errors import LauncherError
from launcher.checks import resolve
from launcher.plan import Request
from launcher.runtime import native
from tests.unit.conftest import RTX5090, make_ctx
from tests.unit.fake_vllm_env import make_env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def envs(tmp_path_factory):
    """Two real environments with different vLLMs, and one without vLLM."""
    root = tmp_path_factory.mktemp("envs")
    return {"a": make_env(root / "a", "0.33.0"), "b": make_env(root / "b", "0.21.0"),
            "none": make_env(root / "none", with_vllm=False)}


@pytest.fixture
def record(tmp_path, monkeypatch):
    path = tmp_path / "record.json"
    monkeypatch.setenv("FAKE_RECORD", str(path))
    return path


def _ctx(env: vllm_env.VllmEnv | None, **kw):
    ctx = make_ctx(RTX5090, vllm=env.vllm_version if env else None, **kw)
    ctx.vllm = env
    return ctx


def _plan(env, recipe="gemma4-e4b", port=None):
    """The plan for the vLLM in ``env`` (its version comes from the inspection)."""
    return resolve(Request(recipe, port=port or _free_port()), _ctx(env, environ=dict(os.environ)))


def test_native_run_waits_for_health_and_chats(envs, record, models, capsys, monkeypatch):
    monkeypatch.setenv("VLLM_NVFP4_GEMM_BACKEND", "cutlass")  # stale for 0.33.0
    env = vllm_env.resolve(str(envs["a"]))
    port = _free_port()
    plan = resolve(Request("gemma4-moe-dflash", vllm_version="0.33.0", port=port, api_key="sk-test-key"),
                   _ctx(env, environ=dict(os.environ)))
    code = native.run(plan, wait=True, timeout=30)
    assert code == 3  # the child's exit code is the launcher's
    rec = json.loads(record.read_text())
    assert rec["argv"][:2] == ["serve", str(models / "gemma-4-26B-A4B-it-NVFP4")]
    assert rec["env"]["VLLM_USE_FLASHINFER_SAMPLER"] == "1"
    assert rec["env"]["VLLM_API_KEY"] == "sk-test-key"
    assert "VLLM_NVFP4_GEMM_BACKEND" not in rec["env"]
    assert "sk-test-key" not in " ".join(rec["argv"])
    captured = capsys.readouterr()
    assert f"http://127.0.0.1:{port}/v1" in captured.out and "hi from gemma4 Bearer ***" in captured.out  # the key was sent (masked: only a known secret is)
    assert "sk-test-key" not in captured.out + captured.err
    # The command is printed before the start, from the interpreter that runs it.
    assert f"starting: {env.python} -m vllm.entrypoints.cli.main serve" in captured.err
    assert f"waiting for vLLM at http://127.0.0.1:{port}/health" in captured.err
    assert "sk-test-key" not in captured.err


def test_runs_the_vllm_it_inspected_not_the_first_on_path(envs, record, models, monkeypatch):
    # PATH offers environment b's vllm first; --vllm-python names a.
    monkeypatch.setenv("PATH", f"{envs['b'].parent}{os.pathsep}{os.environ['PATH']}")
    env = vllm_env.resolve(str(envs["a"]))
    plan = _plan(env)
    assert plan.vllm_version == "0.33.0" and plan.vllm_python == env.python
    assert native.run(plan, wait=True, timeout=30) == 3
    rec = json.loads(record.read_text())
    assert rec["version"] == "0.33.0" and rec["python"] == env.python


def test_without_vllm_here_the_vllm_on_path_is_inspected_and_run(envs, record, models, monkeypatch):
    assert vllm_env.inspect(sys.executable, "test").vllm_version is None  # the launcher's Python has no vLLM
    monkeypatch.setenv("PATH", f"{envs['b'].parent}{os.pathsep}{os.environ['PATH']}")
    env = vllm_env.resolve()
    assert env.vllm_version == "0.21.0" and env.source.startswith("`vllm` on PATH")
    assert env.package_dir and env.package_dir.endswith("vllm")
    plan = _plan(env)
    assert plan.vllm_version_source == "installed" and plan.vllm_python == env.python
    native.run(plan, wait=True, timeout=30)
    assert json.loads(record.read_text())["version"] == "0.21.0"


def test_vllm_python_without_vllm_blocks_with_the_reason(envs, models):
    env = vllm_env.resolve(str(envs["none"]))
    assert not env.has_vllm
    ctx = make_ctx(RTX5090)
    ctx.vllm = env
    plan = resolve(Request("gemma4-e4b"), ctx)
    reason = next(r for r in plan.blocking if r.area == "vllm")
    assert f"no vLLM found in {env.python} (--vllm-python)" in reason.message
    assert plan.vllm_python is None
    with pytest.raises(LauncherError, match="no vLLM to run"):
        native.command(plan)


def test_script_interpreter_reads_pips_long_path_trampoline(tmp_path):
    script = tmp_path / "vllm"
    script.write_text("#!/bin/sh\n'''exec' \"/very/long/venv path/bin/python3\" \"$0\" \"$@\"\n' '''\nimport sys\n")
    assert vllm_env.script_interpreter(script) == "/very/long/venv path/bin/python3"
    script.write_text("#!/opt/vllm/bin/python3.12\nimport sys\n")
    assert vllm_env.script_interpreter(script) == "/opt/vllm/bin/python3.12"


def test_native_run_reports_early_exit(envs, record, models, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_EXIT", "7")
    plan = _plan(vllm_env.resolve(str(envs["b"])))
    assert native.run(plan, wait=True, timeout=30) == 7
    assert "exited with code 7 before it was ready" in capsys.readouterr().err


class _Health(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def do_GET(self):
        self.send_response(200)
        self.end_headers()


@pytest.fixture
def other_server():
    """Another server already answering /health on a port."""
    srv = http.server.HTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


def test_a_port_in_use_refuses_the_start(envs, record, models, other_server):
    plan = _plan(vllm_env.resolve(str(envs["a"])), port=other_server)
    with pytest.raises(LauncherError, match=f"127.0.0.1:{other_server} is already in use"):
        native.run(plan, wait=True, timeout=30)
    assert not record.exists()  # vLLM was never started


def test_another_server_answering_is_not_our_vllm(envs, models, other_server, capsys):
    plan = _plan(vllm_env.resolve(str(envs["a"])), port=other_server)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert native.wait_ready(plan, child, timeout=20) is False
    finally:
        child.kill()
        child.wait()
    err = capsys.readouterr().err
    assert f"does not listen on port {other_server}" in err and "ready in" not in err


def test_health_timeout_exits_non_zero_although_vllm_stops_cleanly(envs, record, models, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_NEVER_READY", "1")
    plan = _plan(vllm_env.resolve(str(envs["a"])))
    assert native.run(plan, wait=True, timeout=2) == native.EXIT_NOT_READY
    err = capsys.readouterr().err
    assert "did not answer" in err and "stopping it" in err and "raise --timeout" in err


@pytest.mark.parametrize("args, message", [
    (["--port", "99999"], "--port 99999: a TCP port is 1 to 65535"),
    (["--port", "0"], "--port 0: a TCP port is 1 to 65535"),
    (["--port=-1"], "--port -1: a TCP port is 1 to 65535"),
    (["--host", "not a host"], "--host 'not a host' is neither an IP address nor a host name"),
    # Issue 28.10: accepted as a host name before.
    (["--host", "999.1.1.1"], "--host '999.1.1.1' is not an IPv4 address: four numbers 0 to 255"),
    (["--host", "10.0.0"], "--host '10.0.0' is not an IPv4 address"),
    (["--timeout=-5"], "--timeout -5: seconds to wait must be more than 0"),
])
def test_bad_address_and_timeout_are_refused(args, message, models):
    from typer.testing import CliRunner

    from launcher.cli import app

    res = CliRunner().invoke(app, ["serve", "--recipe", "gemma4-e4b", "--dry-run", *args])
    assert res.exit_code == 2
    assert message in res.output


def test_make_serve_passes_vllm_python(tmp_path):
    # `make -n` prints the recipe without running it (the venv step included).
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run(["make", "-n", "-C", repo, "serve", "VLLM_PYTHON=/opt/vllm/bin/python", f"VENV={tmp_path}/v"],
                         capture_output=True, text=True, timeout=60).stdout
    assert "launcher serve --recipe gemma4-moe-dflash --vllm-python /opt/vllm/bin/python" in out


@pytest.mark.parametrize("reply", ['{"choices": []}', '[1, 2]', '{"choices": ["hi"]}', '{"choices": [{"message": null}]}'])
def test_a_first_chat_reply_of_another_shape_is_reported_not_raised(reply, envs, record, models, monkeypatch, capsys):
    """Issue 28.5: `{"choices": []}` or a JSON list raised IndexError/TypeError in first_chat."""
    monkeypatch.setenv("FAKE_CHAT_REPLY", reply)
    plan = _plan(vllm_env.resolve(str(envs["a"])))
    assert native.run(plan, wait=True, timeout=30) == 3  # it served, then exited as the stand-in does
    assert f"(first reply: '<unexpected chat reply: {json.dumps(json.loads(reply))}>')" in capsys.readouterr().out


def test_a_failure_after_the_start_stops_the_child(envs, record, models, monkeypatch):
    """Issue 28.5: an exception after vLLM started left it running on the port.

    The failure is injected (wait_ready raises), standing for any bug past the start.
    """
    import psutil

    monkeypatch.setenv("FAKE_NEVER_READY", "1")

    def broken(plan, proc, timeout):
        while not record.exists():  # the child is up and running
            assert proc.poll() is None
            time.sleep(0.02)
        raise RuntimeError("injected failure while waiting")

    monkeypatch.setattr(native, "wait_ready", broken)
    plan = _plan(vllm_env.resolve(str(envs["a"])))
    with pytest.raises(RuntimeError, match="injected failure"):
        native.run(plan, wait=True, timeout=30)
    pid = json.loads(record.read_text())["pid"]
    try:
        alive = psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        assert not alive, "the vLLM child outlived the launcher"
    finally:
        if psutil.pid_exists(pid):
            psutil.Process(pid).kill()


def test_a_vllm_site_on_pythonpath_is_inspected_and_run_on_loopback(tmp_path, record):
    """The GPU harness's way (tests/gpu/runs/served.py): vLLM pip-installed with --target into a
    folder, that folder on PYTHONPATH; `launcher serve` inspects and starts it with its own
    Python, on 127.0.0.1 unless told otherwise."""
    from pathlib import Path

    from tests.unit.fake_vllm_env import make_site

    site = make_site(tmp_path / "site", "0.21.0")
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(repo)]), "MODELS_DIR": str(tmp_path / "m"),
           "FAKE_RECORD": str(record)}
    port = _free_port()
    args = [sys.executable, "-m", "launcher", "serve", "--recipe", "gemma4-e4b", "--port", str(port)]
    plan = json.loads(subprocess.run(args + ["--dry-run", "--json"], env=env, cwd=tmp_path, capture_output=True,
                                     text=True, timeout=120).stdout)
    assert plan["vllm_version"] == "0.21.0" and plan["vllm_version_source"] == "installed"
    assert plan["vllm_python"] == sys.executable
    assert plan["argv"][plan["argv"].index("--host") + 1] == "127.0.0.1"
    # No GPU here: --force past the hardware reason; the fake vLLM answers one chat and exits 3.
    proc = subprocess.run(args + ["--force", "--wait", "--timeout", "60"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    rec = json.loads(record.read_text())
    assert rec["python"] == sys.executable and rec["version"] == "0.21.0"
    assert rec["argv"][rec["argv"].index("--host") + 1] == "127.0.0.1"
    assert rec["env"]["PYTHONPATH"].split(os.pathsep)[0] == str(site)
    assert "ready in" in proc.stdout and f"http://127.0.0.1:{port}/v1" in proc.stdout


@pytest.mark.skipif(os.name == "nt", reason="SIGHUP and the 128+N convention are POSIX")
@pytest.mark.parametrize("signame", ["SIGHUP", "SIGTERM", "SIGQUIT"])
def test_a_signal_to_the_launcher_alone_stops_vllm_and_exits_128_plus_n(signame, tmp_path, record):
    """Issue 55.10: `kill -HUP <launcher>` left vLLM running; SIGTERM exited 241 (sys.exit(-15)).
    Round four: SIGQUIT (Ctrl-\\) still killed the launcher alone and left vLLM running.

    Real processes and real signals: `launcher serve` starts the stand-in vLLM (which never
    gets ready), and the signal goes to the launcher's pid only, as `kill PID` sends it.
    """
    import signal as signals
    from pathlib import Path

    import psutil

    from tests.unit.fake_vllm_env import make_site

    site = make_site(tmp_path / "site", "0.21.0")
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(repo)]), "MODELS_DIR": str(tmp_path / "m"),
           "FAKE_RECORD": str(record), "FAKE_NEVER_READY": "1"}
    launcher = subprocess.Popen([sys.executable, "-m", "launcher", "serve", "--recipe", "gemma4-e4b", "--force",
                                 "--port", str(_free_port())], env=env, cwd=tmp_path,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not record.exists() or not record.read_text():
        assert launcher.poll() is None and time.monotonic() < deadline, launcher.communicate()
        time.sleep(0.05)
    child = psutil.Process(json.loads(record.read_text())["pid"])
    signum = getattr(signals, signame)
    launcher.send_signal(signum)
    try:
        _, err = launcher.communicate(timeout=60)
        assert launcher.returncode == 128 + signum, err
        child.wait(timeout=30)  # raises TimeoutExpired while vLLM still runs
    finally:
        if child.is_running():
            child.kill()


def test_exit_status_follows_the_shell_convention():
    assert native.exit_status(-15) == 143 and native.exit_status(-9) == 137
    assert native.exit_status(3) == 3 and native.exit_status(0) == 0
    assert native.exit_status(0, 1) == 129  # the launcher got SIGHUP, vLLM then shut down cleanly


def test_an_address_not_of_this_machine_is_not_called_in_use():
    """Issue 55.13: `--host 10.255.255.1` read as "already in use" (the bind fails EADDRNOTAVAIL)."""
    with pytest.raises(LauncherError) as err:
        native.ensure_port_free("10.255.255.1", _free_port())
    assert "--host 10.255.255.1 is not an address of this machine" in err.value.message
    assert "in use" not in err.value.message


def test_a_port_really_in_use_is_still_called_in_use():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(LauncherError, match="is already in use"):
            native.ensure_port_free("127.0.0.1", taken.getsockname()[1])


@pytest.mark.parametrize("host, shown", [("::", "http://[::]:8000/v1"), ("::1", "http://[::1]:8000/v1"),
                                         ("127.0.0.1", "http://127.0.0.1:8000/v1")])
def test_the_plan_prints_an_ipv6_endpoint_in_brackets(host, shown, models):
    """Issue 55.13: the endpoint printed as http://:::8000/v1."""
    from launcher.plan import format_plan

    plan = resolve(Request("gemma4-e4b", port=8000, host=host), _ctx(None, environ={}))
    assert f"endpoint      {shown}" in format_plan(plan)


def test_the_first_reply_never_prints_the_api_key_even_when_the_server_echoes_it(tmp_path, record):
    """Round four: the stand-in vLLM answers with the request's Authorization header (as a
    proxy or a hostile server could); `serve --wait` printed that reply, key included."""
    from pathlib import Path

    from tests.unit.fake_vllm_env import make_site

    site = make_site(tmp_path / "site", "0.21.0")
    repo = Path(__file__).resolve().parents[2]
    secret = "sk-echoed-secret-5150"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(repo)]), "MODELS_DIR": str(tmp_path / "m"),
           "FAKE_RECORD": str(record)}
    proc = subprocess.run([sys.executable, "-m", "launcher", "serve", "--recipe", "gemma4-e4b", "--force", "--wait",
                           "--timeout", "60", "--port", str(_free_port()), "--api-key", secret],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "first reply: 'hi from gemma4-e4b Bearer ***'" in proc.stdout
    assert secret not in proc.stdout + proc.stderr


def test_a_ray_head_started_here_is_stopped_when_vllm_ends(tmp_path, monkeypatch):
    """`ray start --head` daemonizes: whether vLLM then exits or fails to start, the launcher runs
    `ray stop` with the same Ray (beside vLLM's python), and only for a head it started."""
    from types import SimpleNamespace

    calls = tmp_path / "calls"
    ray = tmp_path / "ray"  # a real executable where the runtime looks for Ray
    ray.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    ray.chmod(0o755)
    head = SimpleNamespace(argv=["vllm", "serve", "m"], vllm_python=str(tmp_path / "python"), serves_api=False,
                           node_rank=0, role="head", env={},
                           steps=[["ray", "start", "--head", "--port", "6379"], ["vllm", "serve", "m"]])
    monkeypatch.setattr(native, "run_steps", lambda plan: None)
    monkeypatch.setattr(native, "child_env", lambda plan: dict(os.environ))
    monkeypatch.setattr(native, "_serve", lambda *a: 0)
    assert native.run(head) == 0
    assert calls.read_text().splitlines() == ["stop"]

    def fails(*a):
        raise LauncherError("cannot start vLLM")

    monkeypatch.setattr(native, "_serve", fails)
    with pytest.raises(LauncherError):
        native.run(head)
    assert calls.read_text().splitlines() == ["stop", "stop"]
    # a node that started no Ray head (a worker's `ray start --address ... --block` is its own
    # main command; the native multi-node runs no Ray at all) stops nothing
    monkeypatch.setattr(native, "_serve", lambda *a: 0)
    native.run(SimpleNamespace(**{**vars(head), "steps": [["vllm", "serve", "m"]]}))
    assert calls.read_text().splitlines() == ["stop", "stop"]
