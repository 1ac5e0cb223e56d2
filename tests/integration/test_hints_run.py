"""Every launcher command a blocked plan prints as a hint runs as printed (issue 57, item 2).

The README's layout: the launcher in one Python without vLLM (this test's
interpreter), a vLLM in a second venv whose `vllm` script is on PATH. That
vLLM is the released 0.21.0 (its dist-info and the files the series touches,
from PyPI) in a real venv; the models come from a local server speaking the
Hub's API (tests/integration/fake_hub.py). No GPU exists here, so the plan
still blocks on the hardware; every other hint is taken from the plan and
run as printed, with --dry-run where the command has one, and then for real
where that is what the user does next.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from launcher import recipe as recipes
from tests.integration.fake_hub import FakeHub
from tests.integration.patch_trees import mini_tree
from tests.integration.test_models_pull import DRAFTER_REPO, TARGET_REPO, drafter_repo, target_repo, write_recipe
from tests.integration.test_plan_patch_state import _touched_files
from tests.unit.fake_vllm_env import make_env

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = Path(sys.executable).with_name("launcher")
VERSION = "0.21.0"


@pytest.fixture
def layout(tmp_path):
    """A venv with the released vLLM, its `vllm` script on PATH, and a local Hub for the models."""
    python = make_env(tmp_path / "vllm-venv", with_vllm=False)
    purelib = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  check=True, capture_output=True, text=True).stdout.strip())
    mini_tree(VERSION, "site-packages", purelib, _touched_files(VERSION))
    script = python.parent / "vllm"
    script.write_text(f"#!{python}\nimport sys\nfrom vllm.entrypoints.cli.main import main\nsys.exit(main())\n")
    script.chmod(0o755)
    with FakeHub() as hub:
        hub.repos[TARGET_REPO] = target_repo(tmp_path)
        hub.repos[DRAFTER_REPO] = drafter_repo(tmp_path)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING", "VLLM_"))}
        env.update(PATH=f"{python.parent}{os.pathsep}{env['PATH']}", PYTHONPATH=str(ROOT),
                   MODELS_DIR=str(tmp_path / "models"), HF_HOME=str(tmp_path / "hf"), HF_ENDPOINT=hub.url,
                   HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_XET="1")
        yield {"python": python, "purelib": purelib, "env": env,
               "recipe": write_recipe(tmp_path, hub.repos[TARGET_REPO])}


def launcher(args: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([str(LAUNCHER), *args], capture_output=True, text=True, env=env, timeout=300)


def plan(layout) -> dict:
    res = launcher(["serve", "--recipe", str(layout["recipe"]), "--dry-run", "--json"], layout["env"])
    return json.loads(res.stdout)


_COMMAND = re.compile(r"\blauncher ([a-z][^(),;]*)")


def hint_commands(reasons: list[dict]) -> list[list[str]]:
    """Each `launcher ...` a reason's hint names, as argv (the text up to a bracket, comma or semicolon)."""
    out = []
    for reason in reasons:
        for match in _COMMAND.finditer(reason.get("hint") or ""):
            words = shlex.split(match.group(1).strip().removeprefix("with: "))
            if words:
                out.append(words)
    return out


def has_dry_run(words: list[str], env: dict) -> bool:
    subcommand = [w for w in words if not w.startswith("-")][:2]
    return "--dry-run" in launcher([*subcommand, "--help"], env).stdout


def test_patch_commands_find_the_vllm_that_serve_finds(layout):
    """The issue's report: serve saw the vLLM on PATH, `patch apply --dry-run` looked in its own Python."""
    before = plan(layout)
    assert before["vllm_version"] == VERSION and before["vllm_python"] == str(layout["python"])
    for args in (["patch", "apply", "--dry-run"], ["patch", "status"], ["patch", "check"]):
        res = launcher(args, layout["env"])
        assert res.returncode == 0, (args, res.stdout, res.stderr)
        assert f"vLLM {VERSION}" in res.stdout and str(layout["purelib"]) in res.stdout, args


def test_every_hint_of_a_blocked_plan_runs_as_printed(layout):
    env = layout["env"]
    blocked = plan(layout)
    commands = hint_commands(blocked["reasons"])
    names = {" ".join(c[:2]) for c in commands}
    assert {"patch apply", "models pull"} <= names, blocked["reasons"]
    assert f"--vllm-python {layout['python']}" in " ".join(map(shlex.join, commands))
    for words in commands:
        dry = ["--dry-run"] if has_dry_run(words, env) else []
        res = launcher([*words, *dry], env)
        assert res.returncode == 0, (words, res.stdout, res.stderr)
    # Then for real, as the user goes on: the patches and the models are in place.
    for words in commands:
        res = launcher(words, env)
        assert res.returncode == 0, (words, res.stdout, res.stderr)
    after = plan(layout)
    assert all(p["applied"] is True for p in after["patches"]), after["patches"]
    left = {r["area"] for r in after["reasons"] if r["blocking"]}
    assert left == {"hardware"}, after["reasons"]  # no GPU here: the one step outside the launcher
    assert hint_commands([r for r in after["reasons"] if r["blocking"]]) == []


def test_vllm_python_from_the_environment_names_the_vllm_and_stays_out_of_vllms_env(layout):
    env = {**layout["env"], "PATH": os.environ["PATH"], "VLLM_PYTHON": str(layout["python"])}
    res = launcher(["patch", "status"], env)
    assert res.returncode == 0 and str(layout["purelib"]) in res.stdout, res.stdout + res.stderr
    planned = json.loads(launcher(["serve", "--recipe", str(layout["recipe"]), "--dry-run", "--json"], env).stdout)
    assert planned["vllm_python"] == str(layout["python"])
    assert "VLLM_PYTHON" not in planned["env"]  # the launcher's own variable, not one for vLLM


def test_an_unsupported_release_names_the_install_that_fixes_it(layout, tmp_path):
    """0.21.0 under a recipe that does not list it: the hint is `launcher install --version`."""
    data = recipes.load_file(layout["recipe"]).model_dump(mode="json")
    data["vllm_versions"] = ["0.33.0"]
    data["patches"] = {"0.33.0": data["patches"]["0.33.0"]}
    other = tmp_path / "other.yaml"
    other.write_text(json.dumps(data))
    res = launcher(["serve", "--recipe", str(other), "--dry-run", "--json"], layout["env"])
    reasons = [r for r in json.loads(res.stdout)["reasons"] if r["area"] == "vllm"]
    commands = hint_commands(reasons)
    assert commands == [["install", "--version", "0.33.0", "--vllm-python", str(layout["python"])]]
    res = launcher([*commands[0], "--recipe", str(other), "--dry-run"], layout["env"])
    assert res.returncode == 0, res.stdout + res.stderr


def test_doctors_patch_line_is_short_and_its_command_runs(layout):
    """It listed every patch as id=state, about 700 characters (issue 57, item 7)."""
    env = layout["env"]
    report = launcher(["doctor"], env).stdout
    line = next(ln for ln in report.splitlines() if ln.startswith("patches"))
    total = len(json.loads(launcher(["patch", "status", "--json"], env).stdout)["patches"])
    assert line.startswith(f"patches   vLLM {VERSION}: 0 of {total} applied, {total} not applied (launcher patch apply")
    assert len(line) < 200, line
    (command,) = hint_commands([{"hint": line.split("(", 1)[1]}])
    assert launcher(command, env).returncode == 0
    after = next(ln for ln in launcher(["doctor"], env).stdout.splitlines() if ln.startswith("patches"))
    assert after == f"patches   vLLM {VERSION}: {total} of {total} applied"


def test_the_quantize_hint_for_a_bf16_target_runs_as_printed(tmp_path):
    """A bf16 checkpoint where the recipe wants NVFP4: the hint names `launcher quantize`, tried with --dry-run."""
    from tests.unit.test_checkpoint import gemma4_config, gemma4_tensors, make_target

    model = make_target(tmp_path / "my models" / "gemma-bf16", gemma4_config(), gemma4_tensors())
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MODELS_DIR": str(tmp_path / "models")}
    res = launcher(["serve", "--recipe", "gemma4-moe-dflash", "--model", str(model), "--dry-run", "--json"], env)
    reasons = [r for r in json.loads(res.stdout)["reasons"] if r["area"] == "checkpoint"]
    commands = [c for c in hint_commands(reasons) if c[0] == "quantize"]
    assert commands == [["quantize", "--model", str(model), "--out", f"{model}-nvfp4"]], reasons
    assert has_dry_run(commands[0], env)
    res = launcher([*commands[0], "--dry-run"], env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"would quantize {model}" in res.stdout and not (tmp_path / "my models" / "gemma-bf16-nvfp4").exists()
