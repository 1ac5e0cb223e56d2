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
