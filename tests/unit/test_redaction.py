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


def test_redact_text():
    assert redact.text(f"token {SECRET} used", [SECRET]) == "token *** used"
