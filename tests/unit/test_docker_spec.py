"""The docker runtime's container spec: pure, no daemon needed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.errors import LauncherError
from launcher.plan import Plan
from launcher.runtime import docker as rt

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def models(tmp_path, monkeypatch):
    root = tmp_path / "models"
    (root / "target").mkdir(parents=True)
    (root / "drafter").mkdir()
    monkeypatch.setenv("MODELS_DIR", str(root))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    return root


def plan_for(model, drafter=None, **overrides) -> Plan:
    argv = ["vllm", "serve", str(model), "--host", "127.0.0.1", "--port", "8000", "--max-model-len", "4096"]
    if drafter is not None:
        argv += ["--speculative-config", json.dumps({"method": "dflash", "model": str(drafter)})]
    fields = dict(
        recipe="gemma4-moe-dflash", profile="rtx5090", profile_source="--profile", vllm_version="0.21.0",
        vllm_version_source="--vllm-version", runtime="docker", model=Path(model),
        drafter=Path(drafter) if drafter is not None else None, host="127.0.0.1", port=8000,
        env={"VLLM_USE_FLASHINFER_SAMPLER": "1"}, argv=argv, image="vllm-sm12x:0.21.0-sm120-amd64",
    )
    fields.update(overrides)
    return Plan(**fields)


def test_models_under_models_dir_mount_it_read_only_at_models(models):
    spec = rt.container_spec(plan_for(models / "target", models / "drafter"))
    assert spec["mounts"] == [{"type": "bind", "source": str(models), "target": "/models", "read_only": True}]
    assert spec["command"][:3] == ["vllm", "serve", "/models/target"]
    cfg = json.loads(spec["command"][spec["command"].index("--speculative-config") + 1])
    assert cfg == {"method": "dflash", "model": "/models/drafter"}


def test_model_outside_models_dir_gets_its_own_mount(models, tmp_path):
    elsewhere = tmp_path / "scratch" / "target"
    elsewhere.mkdir(parents=True)
    spec = rt.container_spec(plan_for(elsewhere, models / "drafter"))
    assert [(m["source"], m["target"]) for m in spec["mounts"]] == [
        (str(elsewhere), "/models/target"),
        (str(models / "drafter"), "/models/drafter"),
    ]
    assert all(m["read_only"] for m in spec["mounts"])


def test_same_folder_names_do_not_collide(models, tmp_path):
    a, b = tmp_path / "a" / "m", tmp_path / "b" / "m"
    a.mkdir(parents=True)
    b.mkdir(parents=True)
    spec = rt.container_spec(plan_for(a, b))
    assert [m["target"] for m in spec["mounts"]] == ["/models/m", "/models/m_"]


def test_hub_id_is_left_alone_and_hf_cache_is_writable(models, tmp_path):
    (tmp_path / "hf").mkdir()
    spec = rt.container_spec(plan_for(Path("google/gemma-4-26B-A4B-it")))
    assert spec["command"][2] == "google/gemma-4-26B-A4B-it"
    assert spec["mounts"] == [{"type": "bind", "source": str(tmp_path / "hf"), "target": rt.HF_HOME_MOUNT, "read_only": False}]
    assert spec["env"]["HF_HOME"] == rt.HF_HOME_MOUNT


def test_local_models_mount_hf_cache_read_only(models, tmp_path):
    (tmp_path / "hf").mkdir()
    spec = rt.container_spec(plan_for(models / "target", models / "drafter"))
    hf = [m for m in spec["mounts"] if m["target"] == rt.HF_HOME_MOUNT]
    assert hf == [{"type": "bind", "source": str(tmp_path / "hf"), "target": rt.HF_HOME_MOUNT, "read_only": True}]
    assert spec["env"]["HF_MODULES_CACHE"].startswith("/tmp/")


def test_server_binds_all_interfaces_inside_and_loopback_outside(models):
    plan = plan_for(models / "target", port=8123)
    plan.argv += ["--host=10.0.0.1", "--port=9999"]
    spec = rt.container_spec(plan)
    assert [a for a in spec["command"] if a.startswith("--host") or a.startswith("--port")] == ["--host", "--port"]
    assert spec["command"][-4:] == ["--host", "0.0.0.0", "--port", "8000"]
    assert spec["ports"] == {"8000/tcp": ["127.0.0.1", 8123]}
    assert spec["health_url"] == "http://127.0.0.1:8123/health"


@pytest.mark.parametrize("host,published,probe", [
    ("0.0.0.0", "0.0.0.0", "127.0.0.1"),
    ("localhost", "127.0.0.1", "127.0.0.1"),
    ("192.168.1.5", "192.168.1.5", "192.168.1.5"),
])
def test_host_choice(models, host, published, probe):
    spec = rt.container_spec(plan_for(models / "target", host=host))
    assert spec["ports"]["8000/tcp"] == [published, 8000]
    assert spec["endpoint"] == f"http://{probe}:8000/v1"


def test_hostname_is_refused(models):
    with pytest.raises(LauncherError) as err:
        rt.container_spec(plan_for(models / "target", host="myhost.lan"))
    assert "--host 'myhost.lan'" in err.value.message


def test_missing_image_and_wrong_argv_are_refused(models):
    with pytest.raises(LauncherError, match="needs an image"):
        rt.container_spec(plan_for(models / "target", image=None))
    with pytest.raises(LauncherError, match="must start with 'vllm serve'"):
        rt.container_spec(plan_for(models / "target", argv=["python", "-m", "x"]))


def test_secrets_are_named_never_carried(models):
    plan = plan_for(models / "target", api_key="sk-live-abcdef")
    plan.env["HF_TOKEN"] = "hf_zzzzzzzz"
    spec = rt.container_spec(plan)
    dumped = json.dumps(spec)
    assert "sk-live-abcdef" not in dumped and "hf_zzzzzzzz" not in dumped
    assert spec["secret_env"] == ["HF_TOKEN", "VLLM_API_KEY"]
    text = rt.format_container_spec(spec)
    assert "HF_TOKEN=***" in text and "VLLM_API_KEY=***" in text
    assert "sk-live-abcdef" not in text and "hf_zzzzzzzz" not in text
    env = rt.environment(plan, spec)
    assert env["VLLM_API_KEY"] == "sk-live-abcdef" and env["HF_TOKEN"] == "hf_zzzzzzzz"


def test_gpu_request_ipc_labels_and_name(models):
    spec = rt.container_spec(plan_for(models / "target"))
    assert spec["device_requests"] == [{"driver": "", "count": -1, "device_ids": None, "capabilities": [["gpu"]]}]
    assert rt.container_spec(plan_for(models / "target"), gpus=None)["device_requests"] == []
    assert spec["ipc_mode"] == "host"
    assert spec["name"] == "vllm-sm12x-gemma4-moe-dflash"
    assert spec["labels"]["org.vllm-sm12x.vllm-version"] == "0.21.0"
    assert rt.container_name("my recipe/v2") == "vllm-sm12x-my-recipe-v2"


def test_format_shows_an_equivalent_docker_run(models):
    text = rt.format_container_spec(rt.container_spec(plan_for(models / "target", models / "drafter")))
    assert "docker run --rm --name vllm-sm12x-gemma4-moe-dflash" in text
    assert "--gpus all" in text
    assert "-p 127.0.0.1:8000:8000" in text
    assert f"-v {models}:/models:ro" in text


def test_image_hint_names_build_targets(models):
    plan = plan_for(models / "target", profile="dgx-spark", vllm_version="0.33.0")
    hint = rt.image_hint(plan)
    assert "make image-overlay VLLM_VERSION=0.33.0 TARGET=sm121" in hint
    assert "make image VLLM_VERSION=0.33.0 TARGET=sm121" in hint
    # the tag docker/build-image.sh gives the overlay
    assert "--image vllm-sm12x:0.33.0-sm121-arm64-overlay" in hint


def test_cli_dry_run_prints_the_spec_without_a_daemon(models, tmp_path):
    # DOCKER_HOST points nowhere: the dry run must not need a daemon.
    env = dict(os.environ, DOCKER_HOST=f"unix://{tmp_path}/nobody.sock", MODELS_DIR=str(models))
    proc = subprocess.run(
        [sys.executable, "-m", "launcher", "serve", "--recipe", "gemma4-moe-dflash", "--runtime", "docker",
         "--dry-run", "--api-key", "sk-never-printed"],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=120,
    )
    # no image built here: the newest release the recipe supports, as `launcher install` would install
    assert "container\n  image       vllm-sm12x:0.33.0-sm120-amd64" in proc.stdout, proc.stdout + proc.stderr
    assert "vllm serve /models/gemma-4-26B-A4B-it-NVFP4" in proc.stdout
    assert "VLLM_API_KEY=***" in proc.stdout
    assert "sk-never-printed" not in proc.stdout + proc.stderr


def test_restart_policy_detaches_in_spec_and_docker_run_line(models):
    plan = plan_for(models / "target")
    assert rt.container_spec(plan)["restart"] == "no"
    spec = rt.container_spec(plan, restart="unless-stopped")
    assert spec["restart"] == "unless-stopped"
    assert spec["labels"]["org.vllm-sm12x.endpoint"] == "http://127.0.0.1:8000/v1"
    text = rt.format_container_spec(spec)
    assert "docker run -d --restart unless-stopped --name vllm-sm12x-gemma4-moe-dflash" in text
    assert "--rm" not in text
    assert "restart     unless-stopped  (detached; launcher ps / launcher stop)" in text


def test_unknown_restart_policy_is_refused(models):
    with pytest.raises(LauncherError) as err:
        rt.container_spec(plan_for(models / "target"), restart="sometimes")
    assert err.value.message == "--restart 'sometimes' is not a docker restart policy"
    assert err.value.hint == "use no, unless-stopped, always, on-failure"


def test_download_without_a_host_hf_cache_makes_one(models, tmp_path):
    """A Hub id means a download: it goes to the host's HF_HOME (created at
    start), not into the container where it would be lost."""
    spec = rt.container_spec(plan_for(Path("google/gemma-4-26B-A4B-it")))
    [hf] = spec["mounts"]
    assert (hf["source"], hf["target"], hf["read_only"], hf["create"]) == (str(tmp_path / "hf"), rt.HF_HOME_MOUNT, False, True)
    rt._require_mount_sources(spec)
    assert (tmp_path / "hf").is_dir()


def _cli(args, env):
    return subprocess.run([sys.executable, "-m", "launcher", *args], capture_output=True, text=True,
                          env=dict(os.environ, **env), cwd=REPO, timeout=120)


def test_cli_restart_and_hf_environment_in_the_dry_run(models, tmp_path):
    env = {"DOCKER_HOST": f"unix://{tmp_path}/nobody.sock", "MODELS_DIR": str(models),
           "HF_TOKEN": "hf_NeverPrinted99", "HF_HUB_OFFLINE": "1"}
    proc = _cli(["serve", "--recipe", "gemma4-moe-dflash", "--runtime", "docker", "--dry-run",
                 "--restart", "unless-stopped"], env)
    assert "docker run -d --restart unless-stopped" in proc.stdout, proc.stdout + proc.stderr
    assert "HF_HUB_OFFLINE=1" in proc.stdout
    assert "HF_TOKEN=***" in proc.stdout and "-e \"HF_TOKEN=${HF_TOKEN:?" in proc.stdout
    assert "hf_NeverPrinted99" not in proc.stdout + proc.stderr


def test_cli_restart_needs_the_docker_runtime(models, tmp_path):
    proc = _cli(["serve", "--recipe", "gemma4-moe-dflash", "--dry-run", "--restart", "unless-stopped"],
                {"MODELS_DIR": str(models)})
    assert proc.returncode == 2
    assert "error: --restart needs --runtime docker" in proc.stderr


def test_pasted_docker_run_line_never_serves_without_the_key(models, tmp_path):
    """Issue 28.10: `-e VLLM_API_KEY` took the key from the pasting shell, which lacks a key given with
    --api-key: the container served with no key. The line is run for real by bash; `docker` is a
    stand-in that records its arguments (no daemon here)."""
    plan = plan_for(models / "target", api_key="sk-live-abcdef")
    text = rt.format_container_spec(rt.container_spec(plan))
    line = text.split("  as docker run:\n", 1)[1]
    assert "sk-live-abcdef" not in line
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    (bin_dir / "docker").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    without = subprocess.run(["bash", "-c", line], capture_output=True, text=True, env=env, timeout=60)
    assert without.returncode != 0 and without.stdout == ""  # docker never ran
    assert "export VLLM_API_KEY first" in without.stderr
    with_key = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=60,
                              env={**env, "VLLM_API_KEY": "sk-from-the-shell"})
    assert with_key.returncode == 0, with_key.stderr
    args = json.loads(with_key.stdout)
    assert "VLLM_API_KEY=sk-from-the-shell" in args


def test_unparsable_docker_host_is_one_clear_error(tmp_path):
    """Issue 28.10: DOCKER_HOST=tcp://127.0.0.1:99999 gave a ValueError traceback."""
    proc = subprocess.run([sys.executable, "-m", "launcher", "ps"], capture_output=True, text=True, cwd=REPO,
                          env=dict(os.environ, DOCKER_HOST="tcp://127.0.0.1:99999"), timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "cannot reach the Docker daemon at tcp://127.0.0.1:99999" in proc.stderr


# --- the docker runtime's image at plan time (issue 29.4) --------------------
# The daemon's image list is a Context field (probed by `serve --runtime docker`
# through runtime.docker.local_images); here it is described, as the GPU is.


def _image(tag, version, target="sm120", arch="amd64", created="2026-11-01T00:00:00Z"):
    from launcher.plan import LocalImage

    return LocalImage(tag=tag, vllm_version=version, target=target, arch=arch, created=created)


def _docker_plan(images, *, docker_error=None, **request):
    from launcher.checks import resolve
    from launcher.plan import Request
    from tests.unit.conftest import RTX5090, make_ctx

    ctx = make_ctx(RTX5090)
    ctx.images, ctx.docker_error = images, docker_error
    return resolve(Request("gemma4-moe-dflash", runtime="docker", **request), ctx)


def _image_reasons(plan):
    return [r for r in plan.reasons if r.area == "image"]


SOURCE_021 = _image("vllm-sm12x:0.21.0-sm120-amd64", "0.21.0", created="2026-10-01T00:00:00Z")
OVERLAY_033 = _image("vllm-sm12x:0.33.0-sm120-amd64-overlay", "0.33.0", created="2026-11-20T00:00:00Z")
SPARK_033 = _image("vllm-sm12x:0.33.0-sm121-arm64-overlay", "0.33.0", "sm121", "arm64", "2026-11-25T00:00:00Z")


def test_without_image_the_plan_takes_the_newest_image_built_for_this_card(models):
    """After `make image-overlay VLLM_VERSION=0.33.0` the plan ran the 0.21.0 source tag."""
    plan = _docker_plan([SOURCE_021, OVERLAY_033, SPARK_033, _image("busybox:latest", None, None, None)])
    assert plan.image == OVERLAY_033.tag
    assert (plan.vllm_version, plan.vllm_version_source) == ("0.33.0", f"image {OVERLAY_033.tag}")
    assert _image_reasons(plan) == []
    # --vllm-version narrows the choice to the images of that release.
    older = _docker_plan([SOURCE_021, OVERLAY_033], vllm_version="0.21.0")
    assert older.image == SOURCE_021.tag and older.vllm_version == "0.21.0"


def test_a_missing_image_blocks_the_plan_and_names_what_is_here(models):
    plan = _docker_plan([SPARK_033])  # built for the Spark, the card here is a 5090
    assert plan.image == "vllm-sm12x:0.33.0-sm120-amd64"  # the recipe's newest, for the card here
    [reason] = _image_reasons(plan)
    assert reason.blocking
    assert reason.message == ("image vllm-sm12x:0.33.0-sm120-amd64 is not on this machine; vllm-sm12x images here: "
                              "vllm-sm12x:0.33.0-sm121-arm64-overlay (sm121 arm64, vLLM 0.33.0)")
    assert "make image-overlay VLLM_VERSION=0.33.0 TARGET=sm120" in reason.hint
    [none] = _image_reasons(_docker_plan([]))
    assert none.message.endswith("is not on this machine; no vllm-sm12x image is here")


def test_image_flag_is_checked_and_its_label_decides_the_vllm_version(models):
    ngc = _image("vllm-sm12x:0.29.0-ngc26.09-sm120-amd64-overlay", "0.29.0+2d3f1c.nv26.09")
    plan = _docker_plan([SOURCE_021, ngc], image=ngc.tag)
    assert (plan.image, plan.vllm_version) == (ngc.tag, "0.29.0") and _image_reasons(plan) == []
    [missing] = _image_reasons(_docker_plan([SOURCE_021], image="someone/else:1"))
    assert missing.blocking and missing.message.startswith("image someone/else:1 is not on this machine")


def test_an_unreachable_daemon_is_a_reason_and_no_probe_no_reason(models):
    [reason] = _image_reasons(_docker_plan(None, docker_error="cannot reach the Docker daemon at unix:///x.sock"))
    assert reason.blocking and "cannot reach the Docker daemon" in reason.message
    assert _image_reasons(_docker_plan(None)) == []  # not looked at (a test Context, the native runtime)


def test_local_images_reads_tags_and_the_build_labels():
    """A stand-in for the SDK's client (unit tests have no daemon): the labels are the
    ones docker/Dockerfile and Dockerfile.overlay write, read from those files."""
    for dockerfile in ("Dockerfile", "Dockerfile.overlay"):
        text = (REPO / "docker" / dockerfile).read_text(encoding="utf-8")
        for key in ("vllm-version", "target", "arch"):
            assert f"{rt.LABEL}.{key}=" in text, (dockerfile, key)

    class Img:
        def __init__(self, tags, labels, created):
            self.tags, self.labels, self.attrs = tags, labels, {"Created": created}

    class Images:
        def list(self):
            return [Img(["vllm-sm12x:0.33.0-sm120-amd64-overlay", "mine:latest"],
                        {f"{rt.LABEL}.vllm-version": "0.33.0", f"{rt.LABEL}.target": "sm120",
                         f"{rt.LABEL}.arch": "amd64"}, "2026-11-20T00:00:00Z"),
                    Img([], {}, ""), Img(["busybox:1"], None, "2020-01-01T00:00:00Z")]

    class Client:
        images = Images()

    found = rt.local_images(Client())
    assert [(i.tag, i.vllm_version, i.target, i.arch) for i in found] == [
        ("vllm-sm12x:0.33.0-sm120-amd64-overlay", "0.33.0", "sm120", "amd64"),
        ("mine:latest", "0.33.0", "sm120", "amd64"),
        ("busybox:1", None, None, None)]


def test_dry_run_prints_the_container_command_once_and_no_host_side_bind(models, tmp_path):
    """The plan's native command (--host 127.0.0.1) is not what runs in a container (issue 57, item 7)."""
    env = dict(os.environ, DOCKER_HOST=f"unix://{tmp_path}/nobody.sock", MODELS_DIR=str(models))
    proc = subprocess.run(
        [sys.executable, "-m", "launcher", "serve", "--recipe", "gemma4-moe-dflash", "--runtime", "docker",
         "--dry-run"], capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("vllm serve ") == 1
    assert "--host 127.0.0.1" not in proc.stdout and "--host 0.0.0.0" in proc.stdout


def test_the_start_is_announced_as_one_docker_run_line(models):
    spec = rt.container_spec(plan_for(models / "target"))
    line = rt.starting_line(spec)
    assert "\n" not in line and line.startswith("docker run --rm --name vllm-sm12x-gemma4-moe-dflash ")
    assert line.endswith("--host 0.0.0.0 --port 8000")
