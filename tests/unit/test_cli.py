"""The console script in a subprocess, and typer's runner, for every error path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from launcher.cli import app

LAUNCHER = Path(sys.executable).with_name("launcher")


def run(*args, env=None):
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([str(LAUNCHER), *args], capture_output=True, text=True, env=full_env, timeout=60)


@pytest.fixture
def models_env(tmp_path):
    return {"MODELS_DIR": str(tmp_path / "models")}


def test_console_script_dry_run_0_21_shows_user_env_and_spec(models_env):
    res = run("serve", "--recipe", "gemma4-moe-dflash", "--dry-run", "--vllm-version", "0.21.0", env=models_env)
    assert res.returncode == 0, res.stderr  # a dry run that printed its plan (blocked here: no GPU, vLLM, model)
    assert "verdict       BLOCKED" in res.stdout
    for line in ("VLLM_NVFP4_GEMM_BACKEND=flashinfer-cutlass",
                 "VLLM_TEST_FORCE_FP8_MARLIN=0", "VLLM_USE_FLASHINFER_SAMPLER=1",
                 "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1", "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
                 "--moe-backend cutlass"):
        assert line in res.stdout
    assert "VLLM_USE_FLASHINFER_MOE_FP4" not in res.stdout and "TORCH_MATMUL_PRECISION" not in res.stdout
    assert '"method":"dflash"' in res.stdout and '"num_speculative_tokens":15' in res.stdout
    assert "no NVIDIA GPU detected" in res.stdout
    assert "Traceback" not in res.stderr


def test_console_script_dry_run_0_33_shows_flags_and_no_removed_vars(models_env):
    res = run("serve", "--recipe", "gemma4-moe-dflash", "--dry-run", "--vllm-version", "0.33.0", env=models_env)
    assert "--moe-backend cutlass" in res.stdout and "--linear-backend flashinfer_cutlass" in res.stdout
    for removed in ("VLLM_USE_FLASHINFER_MOE_FP4", "VLLM_NVFP4_GEMM_BACKEND", "VLLM_TEST_FORCE_FP8_MARLIN"):
        assert removed not in res.stdout


def test_json_plan(models_env):
    res = run("serve", "--recipe", "gemma4-moe-dflash", "--dry-run", "--json", "--vllm-version", "0.21.0",
              "--api-key", "sk-12345678", env=models_env)
    data = json.loads(res.stdout)
    assert data["verdict"] == "blocked"
    assert data["api_key"] == "***" and "sk-12345678" not in res.stdout


def test_serve_without_dry_run_refuses_with_reason(models_env):
    res = run("serve", "--recipe", "gemma4-moe-dflash", env=models_env)
    assert res.returncode == 2
    assert res.stderr.startswith("error: preflight blocks the start: no NVIDIA GPU detected")
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize("args, first_line", [
    (["serve", "--recipe", "gemma4-moe-dflsh", "--dry-run"], "error: unknown recipe 'gemma4-moe-dflsh'"),
    (["serve", "--recipe", "gemma4-moe-dflash", "--dry-run", "--profile", "rtx4090"], "error: unknown profile"),
    (["serve", "--recipe", "gemma4-moe-dflash", "--dry-run", "--runtime", "podman"], "error: unknown runtime"),
    (["serve", "--recipe", "gemma4-moe-dflash", "--dry-run", "--vllm-version", "banana"], "error: not a vLLM version"),
])
def test_bad_input_one_clear_line(args, first_line, models_env):
    res = run(*args, env=models_env)
    assert res.returncode == 2
    assert res.stderr.splitlines()[0].startswith(first_line)
    assert "Traceback" not in res.stderr


def test_recipes_validate_reports_file_line_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: b\ndescription: d\ntarget: {name: m}\nvllm_versions: ['0.21.0']\n"
                   "min_gpu_memory_gib: -1\nprofiles: {rtx5090: {}}\n")
    res = run("recipes", "validate", str(bad))
    assert res.returncode == 2
    assert res.stderr.startswith(f"error: {bad}:5: field min_gpu_memory_gib:")


def test_runner_recipes_list_and_schema():
    runner = CliRunner()
    listed = runner.invoke(app, ["recipes", "list"])
    assert listed.exit_code == 0
    assert {"gemma4-moe-dflash", "gemma4-moe", "gemma4-31b-dflash", "gemma4-e4b"} <= {
        line.split()[0] for line in listed.output.splitlines()}
    schema = runner.invoke(app, ["recipes", "schema"])
    assert json.loads(schema.output)["title"] == "Recipe"


def test_runner_version():
    from launcher import __version__

    assert CliRunner().invoke(app, ["version"]).output.strip() == f"launcher {__version__}"


def test_dash_dash_version_prints_what_version_prints():
    """`launcher --version`, as `vllm --version` works (issue 29.7); the console script too."""
    from launcher import __version__

    res = run("--version")
    assert res.returncode == 0 and res.stdout.strip() == f"launcher {__version__}"
    assert CliRunner().invoke(app, ["--version"]).output.strip() == f"launcher {__version__}"


def _every_command():
    import typer

    root = typer.main.get_command(app)
    stack = [((), root)]
    while stack:
        path, command = stack.pop()
        yield path, command
        stack += [(path + (name,), sub) for name, sub in getattr(command, "commands", {}).items()]


def test_help_at_80_columns_shows_no_type_placeholders_and_every_option_name_whole():
    """Typer's rich help printed `<bool>` beside flags, `<str>`/`<list[str]>` beside options,
    and cut what did not fit 80 columns with an ellipsis (issue 29.7)."""
    checked = 0
    for path, command in _every_command():
        res = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "80"}, terminal_width=80)
        assert res.exit_code == 0, (path, res.output)
        out = res.output
        for placeholder in ("<bool>", "<str>", "<int>", "<float>", "<path>", "<list[", "<int range>"):
            assert placeholder not in out, (path, placeholder)
        assert "\u2026" not in out and all(len(line) <= 80 for line in out.splitlines()), path
        assert "\\[" not in out, path  # a rich-markup escape shown as typed
        for param in command.params:
            for name in (*param.opts, *getattr(param, "secondary_opts", [])):
                if name.startswith("--") and not getattr(param, "hidden", False):
                    assert name in out, (path, name)
        checked += 1
    assert checked > 30  # every sub-app's commands, not the root alone
    flags = CliRunner().invoke(app, ["bench", "--help"], env={"COLUMNS": "80"}).output
    assert "--compare-without-drafter " in flags and "--timeout FLOAT" in flags and "--out PATH" in flags


def test_make_serve_fails_cleanly_here(tmp_path):
    """`make serve` on this GPU-less machine: plan + verdict, non-zero exit."""
    repo = Path(__file__).resolve().parents[2]
    # -o STAMP: the venv these tests run in is used as it is, never rebuilt by make (a pyproject.toml
    # newer than its stamp re-installed the launcher from this checkout into another checkout's venv).
    venv = Path(sys.executable).parent.parent
    stamp = venv / ".deps-stamp"
    before = stamp.stat().st_mtime_ns if stamp.exists() else None
    res = subprocess.run(["make", "-s", "-o", f"{venv}/.deps-stamp", "serve", f"VENV={venv}"], cwd=repo,
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "MODELS_DIR": str(tmp_path)})
    assert (stamp.stat().st_mtime_ns if stamp.exists() else None) == before, "make re-installed the venv"
    assert "pip install" not in res.stdout
    assert res.returncode != 0
    assert "preflight blocks the start: no NVIDIA GPU detected" in res.stderr
    assert "vllm serve" in res.stdout and "verdict" in res.stdout
