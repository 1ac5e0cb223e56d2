"""The docker runtime against the real daemon (started by tests/engines.sh).

The image is a busybox "fake vLLM" (see docker_env.py): this machine has no
GPU, so the real server cannot start; the fake serves /health with busybox
httpd, which is all the startup/health/shutdown path needs. Everything else —
the daemon, containers, port publishing, mounts, the daemon's own refusal of
the GPU request — is real. Nothing here is mocked.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest

from launcher.errors import LauncherError
from launcher.plan import Plan
from launcher.runtime import docker as rt
from tests.integration import docker_env
from tests.signals import ctrl_c_as_from_a_terminal

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def client():
    return docker_env.client()


@pytest.fixture(scope="module")
def image(client):
    return docker_env.fake_vllm_image(client)


@pytest.fixture
def models(tmp_path, monkeypatch):
    root = tmp_path / "models"
    (root / "target").mkdir(parents=True)
    (root / "drafter").mkdir()
    (root / "target" / "config.json").write_text("{}")
    monkeypatch.setenv("MODELS_DIR", str(root))
    # No host Hugging Face cache: the spec must not depend on this machine's ~/.cache.
    monkeypatch.setenv("HF_HOME", str(tmp_path / "no-hf-cache"))
    return root


def make_plan(models, image, **overrides) -> Plan:
    port = overrides.pop("port", None) or docker_env.free_port()
    env = {"VLLM_USE_FLASHINFER_SAMPLER": "1", "FAKE_VLLM_STARTUP_S": "0"}
    env.update(overrides.pop("env", {}))
    spec_cfg = json.dumps({"method": "dflash", "model": str(models / "drafter"), "num_speculative_tokens": 15})
    fields = dict(
        recipe=f"test-{uuid.uuid4().hex[:8]}",
        profile="rtx5090",
        profile_source="--profile",
        vllm_version="0.21.0",
        vllm_version_source="--vllm-version",
        runtime="docker",
        model=models / "target",
        drafter=models / "drafter",
        host="127.0.0.1",
        port=port,
        env=env,
        argv=["vllm", "serve", str(models / "target"), "--host", "127.0.0.1", "--port", str(port),
              "--speculative-config", spec_cfg],
        image=image,
    )
    fields.update(overrides)
    return Plan(**fields)


def assert_gone(client, plan: Plan) -> None:
    name = rt.container_name(plan.recipe)
    assert docker_env.containers_named(client, name) == [], f"container {name} was left behind"


def created(client, plan: Plan, spec: dict) -> tuple[dict, dict[str, str]]:
    """Create (never start) the container a spec describes; its inspect data and env."""
    container = rt.create(client, spec, rt.environment(plan, spec))
    try:
        attrs = client.api.inspect_container(container.id)
    finally:
        container.remove(force=True)
    return attrs, dict(item.split("=", 1) for item in attrs["Config"]["Env"])


def test_created_container_matches_the_plan(client, image, models):
    plan = make_plan(models, image, api_key="sk-test-123456")
    spec = rt.container_spec(plan)  # with the GPU request: create() accepts it, start() would not
    attrs, env = created(client, plan, spec)
    assert env["VLLM_USE_FLASHINFER_SAMPLER"] == "1"
    assert env["VLLM_API_KEY"] == "sk-test-123456"
    assert env["HF_HOME"] == rt.HF_HOME_MOUNT
    assert "sk-test-123456" not in " ".join(attrs["Config"]["Cmd"])
    assert attrs["Config"]["Cmd"][:3] == ["vllm", "serve", "/models/target"]
    assert attrs["Config"]["Cmd"][-4:] == ["--host", "0.0.0.0", "--port", "8000"]
    spec_cfg = json.loads(attrs["Config"]["Cmd"][attrs["Config"]["Cmd"].index("--speculative-config") + 1])
    assert spec_cfg["model"] == "/models/drafter"
    host = attrs["HostConfig"]
    assert host["PortBindings"] == {"8000/tcp": [{"HostIp": "127.0.0.1", "HostPort": str(plan.port)}]}
    assert [(m["Source"], m["Target"], m["ReadOnly"]) for m in host["Mounts"]] == [(str(models), "/models", True)]
    # What `docker run --gpus all` sends: every GPU, no specific driver or ids.
    [gpu] = host["DeviceRequests"]
    assert (gpu["Driver"], gpu["Count"], gpu["Capabilities"], gpu["DeviceIDs"] or None) == ("", -1, [["gpu"]], None)
    assert host["IpcMode"] == "host"
    assert attrs["Config"]["Labels"]["org.vllm-sm12x.recipe"] == plan.recipe
    assert attrs["Name"] == f"/vllm-sm12x-{plan.recipe}"


def test_gpu_request_refused_by_daemon_names_the_toolkit(client, image, models):
    # This daemon has no NVIDIA runtime: it really answers "could not select device driver".
    plan = make_plan(models, image)
    with pytest.raises(LauncherError) as err:
        rt.run(plan, wait_timeout=30, client=client, gpus="all")
    assert "could not select device driver" in err.value.message
    assert "nvidia-container-toolkit" in err.value.hint
    assert_gone(client, plan)


def test_serves_and_exit_code_follows_the_container(client, image, models, capsys):
    plan = make_plan(models, image, api_key="sk-secret-9876",
                     env={"FAKE_VLLM_MODE": "exit-after-ready", "FAKE_VLLM_EXIT_CODE": "7", "FAKE_VLLM_READY_S": "2"})
    code = rt.run(plan, wait_timeout=60, client=client, gpus=None)
    out, err = capsys.readouterr()
    assert code == 7
    assert f"http://127.0.0.1:{plan.port}/v1" in err
    assert "fake-vllm: serving on 0.0.0.0:8000" in out  # the log was streamed
    assert "fake-vllm key: ***" in out  # the key reached the container, not the terminal
    assert "sk-secret-9876" not in out + err
    assert_gone(client, plan)


def test_startup_crash_shows_last_log_lines(client, image, models):
    plan = make_plan(models, image, env={"FAKE_VLLM_MODE": "crash", "FAKE_VLLM_EXIT_CODE": "3"})
    with pytest.raises(LauncherError) as err:
        rt.run(plan, wait_timeout=60, client=client, gpus=None)
    assert "exited with code 3 during startup" in err.value.message
    assert "ValueError: fake startup failure" in err.value.message
    assert err.value.exit_code == 3
    assert_gone(client, plan)


def test_port_in_use(client, image, models):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        plan = make_plan(models, image, port=port)
        with pytest.raises(LauncherError) as err:
            rt.run(plan, wait_timeout=30, client=client, gpus=None)
    assert f"port 127.0.0.1:{port} is already in use" in err.value.message
    assert "--port" in err.value.hint
    assert_gone(client, plan)


def test_health_timeout_removes_the_container(client, image, models):
    plan = make_plan(models, image, env={"FAKE_VLLM_STARTUP_S": "60"})
    started = time.monotonic()
    with pytest.raises(LauncherError) as err:
        rt.run(plan, wait_timeout=2, client=client, gpus=None)
    assert f"no answer from http://127.0.0.1:{plan.port}/health within 2 s" in err.value.message
    assert "--timeout" in err.value.hint
    assert_gone(client, plan)
    print(f"timeout path took {time.monotonic() - started:.1f} s")


def test_image_missing_says_how_to_get_it(client, models):
    plan = make_plan(models, "vllm-sm12x-test/absent:0.0.0")
    with pytest.raises(LauncherError) as err:
        rt.run(plan, wait_timeout=5, client=client, gpus=None)
    assert "image vllm-sm12x-test/absent:0.0.0 is not on this machine" == err.value.message
    assert "make image-overlay VLLM_VERSION=0.21.0 TARGET=sm120" in err.value.hint
    assert "docker pull" not in err.value.hint  # no vllm-sm12x image is published


def test_daemon_not_reachable(tmp_path, monkeypatch):
    # A real SDK call against a socket nobody listens on.
    sock = tmp_path / "nobody.sock"
    monkeypatch.setenv("DOCKER_HOST", f"unix://{sock}")
    with pytest.raises(LauncherError) as err:
        rt.connect(timeout=5)
    assert f"cannot reach the Docker daemon at unix://{sock}" in err.value.message
    assert "--runtime native" in err.value.hint


def test_missing_model_folder_is_refused_before_create(client, image, models):
    plan = make_plan(models, image, model=models.parent / "elsewhere" / "nothing")
    plan.argv[2] = str(plan.model)
    with pytest.raises(LauncherError) as err:
        rt.run(plan, wait_timeout=5, client=client, gpus=None)
    assert f"{plan.model} does not exist" in err.value.message
    assert_gone(client, plan)


def test_leftover_stopped_container_is_replaced_and_running_one_refused(client, image, models):
    plan = make_plan(models, image, env={"FAKE_VLLM_MODE": "serve"})
    spec = rt.container_spec(plan, gpus=None)
    leftover = rt.create(client, spec, rt.environment(plan, spec))  # as if from an earlier start
    try:
        leftover.start()
        with pytest.raises(LauncherError) as err:
            rt.run(plan, wait_timeout=5, client=client, gpus=None)
        assert f"a container named {spec['name']} is already running" == err.value.message
        leftover.stop(timeout=5)
        plan.env["FAKE_VLLM_MODE"] = "exit-after-ready"
        plan.env["FAKE_VLLM_READY_S"] = "2"
        assert rt.run(plan, wait_timeout=60, client=client, gpus=None) == 0
    finally:
        for c in docker_env.containers_named(client, spec["name"]):
            c.remove(force=True)
    assert_gone(client, plan)


_CHILD = """
import json, sys
from pathlib import Path
from launcher.plan import Plan
from launcher.runtime import docker as rt
d = json.loads(sys.argv[1])
d["model"], d["drafter"] = Path(d["model"]), Path(d["drafter"])
sys.exit(rt.run(Plan(**d), wait_timeout=60, gpus=None))
"""


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)],
                         ids=["ctrl-c", "sigterm", "sighup"])
def test_interrupt_stops_and_removes(client, image, models, sig, code):
    plan = make_plan(models, image)
    fields = {k: (str(v) if k in ("model", "drafter") else v) for k, v in plan.__dict__.items()}
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, json.dumps(fields)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ),
        preexec_fn=ctrl_c_as_from_a_terminal,
    )
    try:
        seen = []
        for line in child.stderr:
            seen.append(line)
            if line.startswith("ready in"):
                break
        assert any(line.startswith("ready in") for line in seen), "".join(seen)
        assert docker_env.containers_named(client, rt.container_name(plan.recipe)), "no container while serving"
        child.send_signal(sig)
        child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == code  # 128+N for a signal (issue 55.10)
    assert_gone(client, plan)


# --- restart after reboot: --restart, launcher ps, launcher stop -----------------


def launcher_cli(*args: str) -> subprocess.CompletedProcess:
    """The real `launcher` command of this checkout, against the real daemon."""
    env = dict(os.environ, PYTHONPATH=str(docker_env.REPO))
    return subprocess.run([sys.executable, "-m", "launcher", *args], capture_output=True, text=True, env=env,
                          timeout=120)


def test_restart_policy_keeps_serving_and_ps_stop_end_it(client, image, models, capsys):
    """`--restart unless-stopped`: once healthy the launcher returns and leaves
    the container to the daemon, which starts it again when it ends (here the
    stand-in exits by itself after 3 s; a reboot is the daemon starting again,
    which this shared daemon cannot do in a test). `launcher ps` lists it;
    `launcher stop` ends and removes it."""
    plan = make_plan(models, image, env={"FAKE_VLLM_MODE": "exit-after-ready", "FAKE_VLLM_READY_S": "3"})
    name = rt.container_name(plan.recipe)
    try:
        assert rt.run(plan, wait_timeout=60, client=client, gpus=None, restart="unless-stopped") == 0
        _, err = capsys.readouterr()
        assert f"launcher stop {name}" in err
        container = client.containers.get(name)
        assert container.attrs["HostConfig"]["RestartPolicy"]["Name"] == "unless-stopped"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            container.reload()
            if container.attrs["RestartCount"] >= 1 and container.status == "running" and rt._healthy(
                    f"http://127.0.0.1:{plan.port}/health"):
                break
            time.sleep(0.5)
        assert container.attrs["RestartCount"] >= 1, "the daemon did not start the container again"
        listed = json.loads(launcher_cli("ps", "--json").stdout)
        [row] = [r for r in listed if r["name"] == name]
        assert (row["restart"], row["recipe"], row["endpoint"]) == (
            "unless-stopped", plan.recipe, f"http://127.0.0.1:{plan.port}/v1")
        table = launcher_cli("ps").stdout
        assert name in table and "unless-stopped" in table
        stopped = launcher_cli("stop", plan.recipe)  # a recipe name finds its container
        assert stopped.returncode == 0, stopped.stderr
        assert f"stopped and removed: {name}" in stopped.stdout
        assert_gone(client, plan)
        assert name not in launcher_cli("ps").stdout
    finally:
        for c in docker_env.containers_named(client, name):
            c.remove(force=True)


def test_a_second_start_names_launcher_stop(client, image, models):
    plan = make_plan(models, image)
    name = rt.container_name(plan.recipe)
    try:
        assert rt.run(plan, wait_timeout=60, client=client, gpus=None, restart="always") == 0
        with pytest.raises(LauncherError) as err:
            rt.run(plan, wait_timeout=5, client=client, gpus=None, restart="always")
        assert err.value.message == f"a container named {name} is already running"
        assert err.value.hint == f"stop it first: launcher stop {name}"
    finally:
        for c in docker_env.containers_named(client, name):
            c.remove(force=True)


def test_stop_touches_only_launcher_containers(client, image):
    """A container the launcher did not start (no label) is refused by name and
    left running. (`stop --all` is not run here: the daemon is shared with
    other checkouts' tests.)"""
    other = client.containers.run(image, ["sh", "-c", "sleep 60"], detach=True,
                                  name=f"wt-docker-foreign-{uuid.uuid4().hex[:8]}")
    try:
        refused = launcher_cli("stop", other.name)
        assert refused.returncode == 2
        assert f"error: container {other.name} was not started by the launcher" in refused.stderr
        missing = launcher_cli("stop", "no-such-recipe-here")
        assert "error: no launcher container named no-such-recipe-here" in missing.stderr
        assert "name the container(s) to stop, or pass --all" in launcher_cli("stop").stderr
        other.reload()
        assert other.status == "running"
    finally:
        other.remove(force=True)


def test_hf_token_home_and_offline_reach_the_container(client, image, models, tmp_path, monkeypatch):
    """HF_TOKEN (a secret: in the container's env, never in the spec or the
    printed command), HF_HUB_OFFLINE, and the host's HF_HOME (mounted, with the
    hub login's token file) reach the container as planned from the shell."""
    from launcher import checks
    from launcher import plan as plans
    from launcher.hardware import HostInfo

    hf_home = tmp_path / "hf-home"
    (hf_home / "hub").mkdir(parents=True)
    monkeypatch.setenv("HF_HOME", str(hf_home))
    environ = {"HF_TOKEN": "hf_TopSecretToken42", "HF_HUB_OFFLINE": "1", "HF_HOME": str(hf_home)}
    ctx = plans.Context(host=HostInfo(system="Linux", machine="x86_64", wsl=False), environ=environ,
                        installed_vllm=None, installed_transformers=None)
    plan = checks.resolve(plans.Request(recipe="gemma4-moe-dflash", runtime="docker", image=image,
                                       model=str(models / "target"), drafter=str(models / "drafter"),
                                       profile="rtx5090", port=docker_env.free_port()), ctx)
    # The container's name comes from the recipe: unique here, as in make_plan, so that a
    # test run beside this one on the same daemon never meets a container of this name.
    plan.recipe = f"test-{uuid.uuid4().hex[:8]}"
    spec = rt.container_spec(plan, gpus=None)
    assert "HF_TOKEN" in spec["secret_env"] and "HF_TOKEN" not in spec["env"]
    assert spec["env"]["HF_HUB_OFFLINE"] == "1" and spec["env"]["HF_HOME"] == rt.HF_HOME_MOUNT
    printed = rt.format_container_spec(spec)
    assert "HF_TOKEN=***" in printed and "-e \"HF_TOKEN=${HF_TOKEN:?" in printed and "hf_TopSecretToken42" not in printed
    attrs, env = created(client, plan, spec)
    assert (env["HF_TOKEN"], env["HF_HUB_OFFLINE"], env["HF_HOME"]) == ("hf_TopSecretToken42", "1", "/cache/huggingface")
    mounts = {m["Target"]: (m["Source"], m["ReadOnly"]) for m in attrs["HostConfig"]["Mounts"]}
    assert mounts["/cache/huggingface"] == (str(hf_home), True)  # both models are local folders
