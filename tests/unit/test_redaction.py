"""Tokens and keys never appear in a printed plan."""

from __future__ import annotations

import json

from launcher import plan as plans
from launcher import redact
from launcher.checks import resolve
from launcher.plan import Request
from tests.unit.conftest import RTX5090, make_ctx

SECRET = "hf_abcdefSECRET123"
KEY = "sk-very-secret-key"


def test_plan_text_and_json_hide_secrets(models):
    plan = resolve(
        Request("gemma4-moe-dflash", vllm_version="0.21.0", api_key=KEY, extra_args=["--api-key", KEY]),
        make_ctx(RTX5090, environ={"HF_TOKEN": SECRET, "VLLM_API_KEY": KEY}),
    )
    text = plans.format_plan(plan)
    blob = json.dumps(plans.to_dict(plan))
    for out in (text, blob):
        assert SECRET not in out and KEY not in out
    assert "HF_TOKEN=***" in text
    assert plan.env["HF_TOKEN"] == SECRET  # the runtime still gets it
    assert KEY not in plan.argv[:-2]  # the plan's own argv never carries the key


def test_redact_argv_forms():
    assert redact.argv(["--api-key", "k1", "--api-key=k2", "--port", "1"]) == [
        "--api-key", "***", "--api-key=***", "--port", "1"]
    # vLLM's --api-key takes several keys, and its parser takes the underscore spelling too
    assert redact.argv(["--api-key", "k1", "k2", "--port", "1"]) == ["--api-key", "***", "***", "--port", "1"]
    assert redact.argv(["--api_key", "k1", "--hf_token=hf_x"]) == ["--api_key", "***", "--hf_token=***"]


def ctx_worker():
    ctx = make_ctx(RTX5090)
    ctx.host.interfaces = {"lo": ["127.0.0.1"], "eth0": ["192.168.1.2"]}
    return ctx


def test_secret_names_are_words_of_the_name():
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "VLLM_API_KEY", "AWS_SECRET_ACCESS_KEY", "hf_token"):
        assert redact.is_secret_name(name), name
    for name in ("TOKENIZERS_PARALLELISM", "serve.max_num_batched_tokens", "drafter.num_speculative_tokens"):
        assert not redact.is_secret_name(name), name
    assert redact.argv(["--api-key", "-starts-with-dash", "--port", "1"]) == ["--api-key", "***", "--port", "1"]


def test_the_other_nodes_command_and_the_container_json_hide_secrets(models, tmp_path):
    """The paste line for the other node repeats the user's --set and the words after `--`; the
    docker --json spec repeats vLLM's argv: neither may carry a key."""
    import os
    import subprocess
    import sys

    from launcher import multinode

    ctx = make_ctx(RTX5090)
    ctx.host.interfaces = {"lo": ["127.0.0.1"], "eth0": ["192.168.1.1"]}
    plan = resolve(Request("gemma4-31b-dflash", vllm_version="0.33.0", sets=[f"HF_TOKEN={SECRET}"],
                           extra_args=["--api-key", KEY, "k2-" + KEY],
                           nodes=multinode.request(2, 0, "192.168.1.1", None, None, None)), ctx)
    shown = plans.format_nodes(plan) + json.dumps(plans.to_dict(plan))
    assert SECRET not in shown and KEY not in shown
    assert '--set HF_TOKEN="${HF_TOKEN:?set HF_TOKEN on this node first}"' in plan.nodes[1].launcher
    # pasted on the other node (launcher replaced by printf, to see the words the shell makes): its
    # own token and keys, and a recipe field whose name holds "tokens" as it was typed
    wide = resolve(Request("gemma4-31b-dflash", vllm_version="0.33.0", api_key=KEY,
                           sets=[f"HF_TOKEN={SECRET}", "serve.max_num_batched_tokens=4096", "TOKENIZERS_PARALLELISM=false"],
                           extra_args=["--api-key", KEY, "k2-" + KEY],
                           nodes=multinode.request(2, 1, "192.168.1.1", None, None, None)), ctx_worker())
    head_line = wide.nodes[0].launcher
    assert SECRET not in head_line and KEY not in head_line
    words = subprocess.run(["bash", "-c", "printf '%s\\n' " + head_line.split(" ", 1)[1]], capture_output=True, text=True,
                           env={"PATH": "/usr/bin:/bin", "HF_TOKEN": "hf_theirs", "VLLM_API_KEY": "k_theirs",
                                "VLLM_API_KEY_2": "k2_theirs"})
    assert words.returncode == 0, words.stderr
    said = words.stdout.splitlines()
    assert said[said.index("--api-key") + 1] == "k_theirs"  # the head serves with that node's key
    assert ["--set", "serve.max_num_batched_tokens=4096"] == said[said.index("serve.max_num_batched_tokens=4096") - 1:][:2]
    assert "TOKENIZERS_PARALLELISM=false" in said and "HF_TOKEN=hf_theirs" in said
    assert said[-3:] == ["--api-key", "k_theirs", "k2_theirs"]  # the words after --, from its own variables
    env = dict(os.environ, DOCKER_HOST=f"unix://{tmp_path}/nobody.sock", MODELS_DIR=str(models))
    out = subprocess.run([sys.executable, "-m", "launcher", "serve", "--recipe", "gemma4-moe-dflash", "--runtime",
                          "docker", "--image", "foo:1", "--dry-run", "--json", "--", f"--api-key={KEY}"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert KEY not in out.stdout and "--api-key=***" in json.loads(out.stdout)["container"]["command"]


def test_redact_text():
    assert redact.text(f"token {SECRET} used", [SECRET]) == "token *** used"


def test_the_values_masked_on_argv_are_masked_in_logs_too():
    args = ["vllm", "serve", "m", "--api-key", "k1-long", "k2-long", "--port", "1", "--hf_token=hf_xyz1"]
    assert redact.argv_secrets(args) == ["k1-long", "k2-long", "hf_xyz1"]
    line = "non-default args: {'api_key': ['k1-long', 'k2-long'], 'hf_token': 'hf_xyz1'}"
    assert redact.text(line, redact.argv_secrets(args)) == "non-default args: {'api_key': ['***', '***'], 'hf_token': '***'}"


def test_recipes_show_masks_a_recipes_secrets(tmp_path):
    """`recipes show` printed a recipe's HF_TOKEN and --api-key as written, where `serve
    --dry-run` and `doctor` masked them."""
    from typer.testing import CliRunner

    from launcher.cli import app
    from launcher.paths import recipes_dir

    src = (recipes_dir() / "gemma4-moe.yaml").read_text()
    src = src.replace('extra_args: ["--kv-cache-dtype", "bfloat16"]',
                      'extra_args: ["--kv-cache-dtype", "bfloat16", "--api-key", "sk-recipesecret"]')
    src = src.replace("\nenv:\n", '\nenv:\n  HF_TOKEN: hf_secretXYZ\n  HF_ENDPOINT: "https://u:pw1234@mirror.example"\n', 1)
    path = tmp_path / "with-secrets.yaml"
    path.write_text(src)
    res = CliRunner().invoke(app, ["recipes", "show", str(path)])
    assert res.exit_code == 0, res.output
    for secret in ("hf_secretXYZ", "sk-recipesecret", "pw1234"):
        assert secret not in res.output
    assert "HF_TOKEN: '***'" in res.output and "https://***@mirror.example" in res.output
    assert "PYTORCH_CUDA_ALLOC_CONF: expandable_segments:True" in res.output  # the rest as it was


def test_a_login_in_hf_endpoint_is_never_printed(tmp_path):
    """The Hub address `models pull` prints (and names in its errors) hides a login, as `bench
    --url` and `install --pip-arg` do; the real command, with HF_ENDPOINT in its environment."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "HF_ENDPOINT": "https://user:hfsecretpw@mirror.example.com", "MODELS_DIR": str(tmp_path)}
    res = subprocess.run([sys.executable, "-m", "launcher", "models", "pull", "-r", "gemma4-moe", "--dry-run"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "hfsecretpw" not in res.stdout + res.stderr and "hub       https://***@mirror.example.com" in res.stdout
