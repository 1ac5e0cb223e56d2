"""Bad or odd input on the command line: each gets a clear answer, none is silently dropped."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from launcher.cli import app
from launcher.paths import recipes_dir


def invoke(*args):
    return CliRunner().invoke(app, list(args))


def plan_json(*args) -> dict:
    res = invoke("serve", "--recipe", "gemma4-e4b", "--dry-run", "--json", "--vllm-version", "0.21.0", *args)
    assert res.exit_code == 0, res.output  # a dry run that printed its plan
    return json.loads(res.stdout)


def test_a_stray_word_before_dashdash_is_refused(models):
    res = invoke("serve", "--recipe", "gemma4-e4b", "--dry-run", "true")
    assert res.exit_code == 2
    assert "unexpected argument(s) 'true' before `--`" in res.output
    # After `--` the same word is vLLM's.
    assert plan_json("--", "--enforce-eager", "true")["argv"][-2:] == ["--enforce-eager", "true"]


@pytest.mark.parametrize("value", ["0.10", "no", "on", "1e3"])
def test_set_keeps_the_typed_string_for_string_fields(value, models):
    argv = plan_json("--set", f"serve.tool_call_parser={value}")["argv"]
    assert argv[argv.index("--tool-call-parser") + 1] == value
    assert plan_json("--set", f"env.MY_KNOB={value}")["env"]["MY_KNOB"] == value


def test_set_still_reads_numbers_and_lists(models):
    data = plan_json("--set", "serve.max_num_seqs=8", "--set", "serve.gpu_memory_utilization=0.5")
    argv = data["argv"]
    assert argv[argv.index("--max-num-seqs") + 1] == "8" and argv[argv.index("--gpu-memory-utilization") + 1] == "0.5"
    res = invoke("serve", "--recipe", "gemma4-e4b", "--dry-run", "--set", "serve.max_num_seqs=many")
    assert res.exit_code == 2 and "--set serve.max_num_seqs=many: field" in res.output


def test_set_with_an_empty_value_is_refused_and_null_means_vllms_default(models):
    res = invoke("serve", "--recipe", "gemma4-e4b", "--dry-run", "--set", "serve.max_num_seqs=")
    assert res.exit_code == 2 and "--set serve.max_num_seqs=: empty value" in res.output
    argv = plan_json("--set", "serve.max_num_seqs=null", "--set", "profiles.rtx5090.serve.max_num_seqs=null")["argv"]
    assert "--max-num-seqs" not in argv


def test_set_drafter_empty_names_drafter_null_and_null_serves_without_drafter(models):
    res = invoke("serve", "--recipe", "gemma4-moe-dflash", "--dry-run", "--set", "drafter=")
    assert res.exit_code == 2 and "--set drafter=: empty value" in res.output
    assert "--set drafter=null serves without the drafter" in res.output
    res = invoke("serve", "--recipe", "gemma4-moe-dflash", "--dry-run", "--json", "--vllm-version", "0.21.0",
                 "--set", "drafter=null")
    assert res.exit_code == 0, res.output  # a dry run that printed its plan
    assert "--speculative-config" not in json.loads(res.stdout)["argv"]


def test_every_shipped_hint_to_serve_without_the_drafter_says_drafter_null():
    """The README, the plan's Spark warning, bench's hint and the recipe comment
    once gave `--set drafter=`, which set_field refuses (issue 29.1)."""
    import inspect
    import re

    from launcher import plan
    from launcher.bench import cli as bench_cli

    texts = {"README.md": (recipes_dir().parent / "README.md").read_text(encoding="utf-8"),
             "plan.py": inspect.getsource(plan), "bench/cli.py": inspect.getsource(bench_cli),
             "recipe": (recipes_dir() / "gemma4-moe-dflash.yaml").read_text(encoding="utf-8")}
    for name, text in texts.items():
        assert "drafter=null" in text, name
        assert not re.search(r"--set drafter=(?!null)", text), name


def test_json_without_dry_run_is_refused(models):
    res = invoke("serve", "--recipe", "gemma4-e4b", "--json")
    assert res.exit_code == 2 and "--json prints the plan of a dry run" in res.output


def test_a_recipe_path_that_does_not_exist_says_file_not_found(models):
    res = invoke("serve", "--recipe", "./nope.yaml", "--dry-run")
    assert res.exit_code == 2 and "recipe file ./nope.yaml not found" in res.output
    assert "unknown recipe" not in res.output


def test_plan_env_lines_are_shell_quoted(models):
    res = invoke("serve", "--recipe", "gemma4-e4b", "--dry-run", "--set", "MY_FLAGS=a b;c")
    assert "  MY_FLAGS='a b;c'    # --set" in res.stdout


def test_api_key_after_dashdash_warns_and_stays_masked(models):
    data = plan_json("--", "--api-key", "sk-secret-123")
    assert any("--api-key after `--` puts the key on vLLM's command line" in w for w in data["warnings"])
    assert "sk-secret-123" not in json.dumps(data)


# --- recipes validate -------------------------------------------------------


def test_recipes_validate_reports_every_error_of_every_file(tmp_path):
    good = tmp_path / "good.yaml"
    shutil.copy(recipes_dir() / "gemma4-moe.yaml", good)
    two_errors = tmp_path / "two.yaml"
    two_errors.write_text((recipes_dir() / "gemma4-moe.yaml").read_text()
                          .replace("min_gpu_memory_gib: 24", "min_gpu_memory_gib: -1")
                          .replace("max_model_len: 131072", "max_model_len: 1", 1))
    bad_patch = tmp_path / "patch.yaml"
    text = (recipes_dir() / "gemma4-moe-dflash.yaml").read_text()
    bad_patch.write_text(text.replace("    - dflash-target-layer-ids-offset\n", "    - dflash-target-layer-id-offset\n"))

    res = invoke("recipes", "validate", str(two_errors), str(bad_patch), str(good))
    assert res.exit_code == 2
    err = res.stderr
    assert f"{two_errors}:" in err and "field min_gpu_memory_gib" in err and "field serve.max_model_len" in err
    line = text.splitlines().index("    - dflash-target-layer-ids-offset") + 1
    assert (f"{bad_patch}:{line}: field patches.0.21.0.3: 'dflash-target-layer-id-offset' is not a patch of the "
            "vLLM 0.21.0 series (did you mean dflash-target-layer-ids-offset?)") in err
    assert f"{good}: ok" in res.stdout
    assert "2 of 3 recipe file(s) invalid" in err


def test_shipped_recipes_validate_with_their_patch_ids():
    files = sorted(str(p) for p in recipes_dir().glob("*.yaml"))
    res = invoke("recipes", "validate", *files)
    assert res.exit_code == 0, res.output


# --- doctor -----------------------------------------------------------------


def test_doctor_with_a_broken_model_exits_1_and_says_why(tmp_path):
    broken = tmp_path / "ckpt"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    res = invoke("doctor", "--model", str(broken))
    assert res.exit_code == 1
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("checkpoint"))
    assert line.startswith(f"checkpoint {broken}:") and "{" not in line
    assert "config.json" in res.stdout


def test_doctor_uses_model_for_the_recipe_verdict(tmp_path):
    missing = tmp_path / "not-here"
    res = invoke("doctor", "--json", "--recipe", "gemma4-e4b", "--model", str(missing))
    report = json.loads(res.stdout)
    assert res.exit_code == 1
    assert any(str(missing) in r for r in report["recipes"]["gemma4-e4b"]["reasons"])
    assert report["checkpoint"]["blocking"] is True
