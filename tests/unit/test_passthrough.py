"""vLLM flags after `--` that the plan also sets: one copy, never silent (issue 57, item 3).

Each is either taken as the launcher's own option (--host, --port: endpoint,
wait, docker mapping), refused with the `--set` that says the same (a recipe
field), or replaces the recipe's copy with a warning. The refusal's `--set`
is then run as printed.
"""

from __future__ import annotations

import json
import shlex
import socket

import pytest
from typer.testing import CliRunner

from launcher.cli import app
from launcher.runtime import docker as docker_runtime
from launcher.runtime import native
from launcher.checks import resolve
from launcher.plan import Request
from tests.unit.conftest import RTX5090, make_ctx


def invoke(*args):
    return CliRunner().invoke(app, list(args))


def plan_json(*args, recipe="gemma4-moe-dflash", runtime="native") -> dict:
    res = invoke("serve", "--recipe", recipe, "--dry-run", "--json", "--vllm-version", "0.33.0",
                 "--runtime", runtime, *args)
    assert res.exit_code == 0, res.output  # a dry run that printed its plan
    return json.loads(res.stdout)


def _count(argv: list[str], flag: str) -> int:
    return sum(1 for a in argv if a == flag or a.startswith(flag + "="))


def _value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


@pytest.mark.parametrize("tail", [["--port", "9000"], ["--port=9000"]])
def test_port_after_dashdash_moves_the_endpoint_and_leaves_one_copy(tail, models):
    data = plan_json("--", *tail)
    assert _count(data["argv"], "--port") == 1 and _value(data["argv"], "--port") == "9000"
    res = invoke("serve", "--recipe", "gemma4-moe-dflash", "--dry-run", "--vllm-version", "0.33.0", "--", *tail)
    assert "endpoint      http://127.0.0.1:9000/v1" in res.stdout


def test_port_after_dashdash_is_where_wait_and_health_look(models):
    from launcher import passthrough

    lifted = passthrough.lift_address(Request("gemma4-moe-dflash", vllm_version="0.33.0",
                                              extra_args=["--port", "9123", "--host", "127.0.0.2"]), set())
    plan = resolve(lifted, make_ctx(RTX5090))
    assert native.base_url(plan) == "http://127.0.0.2:9123"
    assert _value(plan.argv, "--port") == "9123" and _value(plan.argv, "--host") == "127.0.0.2"


def test_port_after_dashdash_moves_the_docker_mapping_not_the_inside(models):
    data = plan_json("--", "--port", "9000", runtime="docker")
    container = data["container"]
    assert container["ports"] == {"8000/tcp": ["127.0.0.1", 9000]}
    assert container["endpoint"] == "http://127.0.0.1:9000/v1"
    # Inside, vLLM binds 0.0.0.0:8000 once; the user's port is the published one, not dropped.
    assert _count(container["command"], "--port") == 1 and _value(container["command"], "--port") == "8000"


def test_port_before_and_after_dashdash_disagreeing_is_refused(models):
    res = invoke("serve", "--recipe", "gemma4-moe-dflash", "--dry-run", "--port", "8001", "--", "--port", "9000")
    assert res.exit_code == 2
    assert "--port 8001 and `-- --port 9000` disagree" in res.output
    same = plan_json("--port", "9000", "--", "--port", "9000")
    assert _count(same["argv"], "--port") == 1


@pytest.mark.parametrize("tail, message", [
    (["--port", "nine"], "a port is a number from 1 to 65535"),
    (["--port", "70000"], "--port 70000: a TCP port is 1 to 65535"),
    (["--port"], "--port takes one value"),
    (["--port", "9000", "--port", "9001"], "--port is given twice after `--`"),
])
def test_bad_port_after_dashdash_is_refused(tail, message, models):
    res = invoke("serve", "--recipe", "gemma4-moe-dflash", "--dry-run", "--", *tail)
    assert res.exit_code == 2 and message in res.output


@pytest.mark.parametrize("tail, field, flag, planned", [
    (["--max-model-len", "8192"], "serve.max_model_len=8192", "--max-model-len", ["8192"]),
    (["--max_model_len=8192"], "serve.max_model_len=8192", "--max-model-len", ["8192"]),
    (["--served-model-name", "a", "b"], "target.served_names=[a, b]", "--served-model-name", ["a", "b"]),
    (["--gpu-memory-utilization", "0.7"], "serve.gpu_memory_utilization=0.7", "--gpu-memory-utilization", ["0.7"]),
    (["--no-enable-prefix-caching"], "serve.enable_prefix_caching=false", "--enable-prefix-caching", None),
    (["--moe-backend", "marlin"], "intent.moe_fp4_backend=marlin", "--moe-backend", ["marlin"]),
])
def test_recipe_flag_after_dashdash_is_refused_with_a_set_that_works(tail, field, flag, planned, models):
    res = invoke("serve", "--recipe", "gemma4-moe-dflash", "--dry-run", "--vllm-version", "0.33.0", "--", *tail)
    assert res.exit_code == 2, res.output
    hint = next(line for line in res.output.splitlines() if line.startswith("hint: use --set "))
    suggested = shlex.split(hint.removeprefix("hint: use ").split(" (")[0])
    assert suggested == ["--set", field]
    argv = plan_json(*suggested)["argv"]  # the hint, run as printed
    if planned is None:  # the switch off: the plan no longer turns it on
        assert flag not in argv
    else:
        assert _count(argv, flag) == 1 and argv[argv.index(flag) + 1:][:len(planned)] == planned


def test_speculative_config_after_dashdash_names_the_drafter_options(models):
    res = invoke("serve", "--recipe", "gemma4-moe-dflash", "--dry-run", "--", "--speculative-config", "{}")
    assert res.exit_code == 2 and "--set drafter=null" in res.output
    # Without a drafter the plan sets none, and the user's is theirs.
    argv = plan_json("--set", "drafter=null", "--", "--speculative-config", '{"method":"ngram"}')["argv"]
    assert argv[-2:] == ["--speculative-config", '{"method":"ngram"}']


def test_other_recipe_flag_is_replaced_with_a_warning(models):
    data = plan_json("--", "--kv-cache-dtype", "fp8")
    assert _count(data["argv"], "--kv-cache-dtype") == 1 and data["argv"][-2:] == ["--kv-cache-dtype", "fp8"]
    assert "`-- --kv-cache-dtype fp8` replaces the recipe's --kv-cache-dtype bfloat16" in data["warnings"]


def test_a_flag_the_plan_does_not_set_passes_unchanged(models):
    argv = plan_json("--", "--enforce-eager", "--attention-config", '{"flash_attn_version": 2}')["argv"]
    assert argv[-3:] == ["--enforce-eager", "--attention-config", '{"flash_attn_version": 2}']


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_wait_polls_the_port_given_after_dashdash(tmp_path, models, monkeypatch):
    """A real start (--force: no GPU here) of a stand-in vLLM that listens where its argv's --port says."""
    from tests.unit.fake_vllm_env import make_env

    python = make_env(tmp_path / "env", "0.33.0")
    record = tmp_path / "record.json"
    monkeypatch.setenv("FAKE_RECORD", str(record))
    port = _free_port()
    res = invoke("serve", "--recipe", "gemma4-e4b", "--vllm-python", str(python), "--force", "--wait",
                 "--timeout", "60", "--", "--port", str(port))
    assert res.exit_code == 3, res.output  # the stand-in exits 3 after its one chat
    assert "ready in" in res.output and f"http://127.0.0.1:{port}/v1" in res.output
    argv = json.loads(record.read_text())["argv"]
    assert _count(argv, "--port") == 1 and _value(argv, "--port") == str(port)


def test_container_spec_renders_no_second_port(models):
    plan = resolve(docker_lift("9000"), make_ctx(RTX5090))
    spec = docker_runtime.container_spec(plan)
    assert spec["ports"]["8000/tcp"] == ["127.0.0.1", 9000]


def docker_lift(port: str) -> Request:
    from launcher import passthrough

    return passthrough.lift_address(Request("gemma4-moe-dflash", vllm_version="0.33.0", runtime="docker",
                                            extra_args=["--port", port]), set())


def test_the_plan_names_the_bench_command_for_a_moved_port(models):
    """bench looks at 127.0.0.1:8000 unless told: a plan served elsewhere says how to point it there."""
    moved = invoke("serve", "--recipe", "gemma4-moe-dflash", "--dry-run", "--", "--port", "9000").stdout
    line = next(ln for ln in moved.splitlines() if ln.startswith("bench "))
    assert line == "bench         launcher bench --recipe gemma4-moe-dflash --url http://127.0.0.1:9000"
    default = invoke("serve", "--recipe", "gemma4-moe-dflash", "--dry-run").stdout
    assert not any(ln.startswith("bench ") for ln in default.splitlines())  # bench's default already


@pytest.mark.parametrize("tail", [["--model", "/etc"], ["--model=/etc"]])
def test_model_after_dashdash_is_refused_not_silently_ignored(tail, models):
    """Round four: `-- --model /etc` went to vLLM after the positional model, which vLLM
    serves instead; the plan, its checks and the user all believed otherwise."""
    res = invoke("serve", "--recipe", "gemma4-moe-dflash", "--dry-run", "--vllm-version", "0.33.0", "--", *tail)
    assert res.exit_code == 2, res.output
    assert f"`-- {' '.join(tail)}`: the model is the launcher's own option" in res.output
    assert "--model DIR" in res.output


@pytest.mark.parametrize("extra, why", [
    (["--host", "0.0.0.0"], "launcher serve --host VALUE"),
    (["--port=9000"], "launcher serve --port VALUE"),
    (["--max-model-len", "999"], "serve.max_model_len"),
    (["--speculative-config", "{}"], "--set drafter=null"),
    (["--tensor-parallel-size", "2"], "cluster.tensor_parallel"),
])
def test_a_recipe_whose_extra_args_repeat_a_planned_flag_is_refused_by_file_line_and_field(tmp_path, extra, why):
    """A second copy in serve.extra_args would win in vLLM's parser: the plan would show
    127.0.0.1 and port 8000 while vLLM binds 0.0.0.0 and listens on 9000."""
    from launcher.paths import recipes_dir

    src = (recipes_dir() / "gemma4-moe.yaml").read_text()
    line = next(i for i, t in enumerate(src.splitlines(), 1) if t.strip().startswith("extra_args:"))
    bad = tmp_path / "gemma4-moe.yaml"
    bad.write_text(src.replace('extra_args: ["--kv-cache-dtype", "bfloat16"]',
                               f"extra_args: {json.dumps(['--kv-cache-dtype', 'bfloat16', *extra])}"))
    before = bad.read_bytes()
    res = invoke("recipes", "validate", str(bad))
    assert res.exit_code == 2, res.output
    assert f"{bad}:{line}: field serve.extra_args: {extra[0].split('=')[0]} is rendered by the plan" in res.output
    assert why in res.output and bad.read_bytes() == before
    # the same words through --set: refused, nothing planned
    res = invoke("serve", "--recipe", "gemma4-moe", "--dry-run", "--set", f"serve.extra_args={json.dumps(extra)}")
    assert res.exit_code == 2 and "field serve.extra_args" in res.output and "vllm serve" not in res.output


def test_an_extra_arg_repeating_any_other_rendered_flag_is_refused_when_the_plan_renders():
    from launcher import passthrough
    from launcher.errors import LauncherError

    own = ["vllm", "serve", "/m", "--attention-config", "{}", "--kv-cache-dtype", "bfloat16"]
    assert passthrough.merge_extra(own, ["--enforce-eager"]) == own + ["--enforce-eager"]
    with pytest.raises(LauncherError, match="serve.extra_args --attention-config .*: the plan already renders"):
        passthrough.merge_extra(own, ["--attention-config", '{"flash_attn_version": 2}'])


@pytest.mark.parametrize("args", [
    ["--recipe", "gemma4-moe"],
    ["--recipe", "gemma4-moe-dflash", "--set", "drafter=null"],
])
def test_a_drafter_given_to_a_plan_without_one_is_refused_not_dropped(args, tmp_path):
    """The plan served the target alone and said nothing: the user believed a drafter served."""
    res = invoke("serve", *args, "--dry-run", "--drafter", str(tmp_path))
    assert res.exit_code == 2, res.output
    assert f"--drafter {tmp_path}: recipe" in res.output and "serves without a drafter" in res.output
    assert "vllm serve" not in res.output


def test_an_image_for_the_native_runtime_is_refused_not_shown_and_ignored():
    res = invoke("serve", "--recipe", "gemma4-moe", "--dry-run", "--image", "foo:1")
    assert res.exit_code == 2 and "--image foo:1 needs --runtime docker" in res.output
    assert "vllm serve" not in res.output
