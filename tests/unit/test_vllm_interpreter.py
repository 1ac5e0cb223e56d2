"""Finding the vLLM interpreter when what is found is not one (issue 28.8), and doctor's exit code (28.10).

Real processes throughout: the launcher's own console script, run with a PATH
holding the odd `vllm` (a bash wrapper; a script whose interpreter prints
text), and `/bin/true` given as --vllm-python.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.test_checkpoint import nvfp4_target

LAUNCHER = Path(sys.executable).with_name("launcher")


def _run(*args, path: Path | None = None, models: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if path is not None:
        env["PATH"] = f"{path}:/usr/bin:/bin"
    if models is not None:
        env["MODELS_DIR"] = str(models)
    return subprocess.run([str(LAUNCHER), *args], capture_output=True, text=True, timeout=120, env=env)


def _script(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


@pytest.mark.parametrize("command", [["serve", "--recipe", "gemma4-e4b", "--dry-run"], ["doctor"]])
def test_vllm_python_that_is_not_python_is_named(command):
    res = _run(*command, "--vllm-python", "/bin/true")
    assert "Traceback" not in res.stderr, res.stderr
    out = res.stdout + res.stderr
    assert "/bin/true (--vllm-python) is not a Python that reports its packages" in out and "printed nothing" in out
    assert "pass --vllm-python with the python executable of the environment that has vLLM" in out
    assert res.returncode == (2 if command[0] == "serve" else 1)
    if command[0] == "doctor":
        assert "recipes" in res.stdout  # the rest of the report is still there


def test_vllm_on_path_whose_interpreter_prints_text(tmp_path):
    fake = _script(tmp_path / "env" / "python3", "#!/bin/sh\necho 'this is not python'\n")
    bin_dir = tmp_path / "bin"
    _script(bin_dir / "vllm", f"#!{fake}\nimport sys\n")
    # A dry run that printed its plan exits 0 (the verdict says blocked); doctor's check found problems: 1.
    for command, code in ((["serve", "--recipe", "gemma4-e4b", "--dry-run"], 0), (["doctor"], 1)):
        res = _run(*command, path=bin_dir)
        assert "Traceback" not in res.stderr, res.stderr
        assert res.returncode == code, res.stdout + res.stderr
        assert f"{fake} (`vllm` on PATH: {bin_dir / 'vllm'}) is not a Python that reports its packages" in res.stdout
        assert "printed 'this is not python'" in res.stdout and "--vllm-python" in res.stdout


def test_a_bash_wrapper_named_vllm_is_reported_by_doctor(tmp_path):
    bin_dir = tmp_path / "bin"
    _script(bin_dir / "vllm", "#!/bin/bash\nexec /opt/vllm/bin/python -m vllm.entrypoints.cli.main \"$@\"\n")
    res = _run("doctor", path=bin_dir)
    assert res.returncode == 1, res.stdout + res.stderr  # no recipe fits here (no GPU), but it reports
    assert f"{bin_dir / 'vllm'} is a script run by /bin/bash, so the Python whose vLLM it starts is unknown" in res.stdout
    assert "gpu       none:" in res.stdout
    plan = _run("serve", "--recipe", "gemma4-e4b", "--dry-run", "--json", path=bin_dir)
    reasons = [r["message"] for r in json.loads(plan.stdout)["reasons"] if r["area"] == "vllm"]
    assert any("is a script run by /bin/bash" in r for r in reasons), reasons


def test_doctor_model_decides_the_exit_code_alone(tmp_path):
    """Issue 28.10: `doctor --model GOOD` exited 1 because no recipe fits this GPU-less machine."""
    good = nvfp4_target(tmp_path / "good")
    res = _run("doctor", "--model", str(good), "--json")
    report = json.loads(res.stdout)
    assert report["checkpoint"]["blocking"] is False
    assert not any(v["fits"] for v in report["recipes"].values())  # nothing fits here ...
    assert res.returncode == 0  # ... and the model asked about is fine
    bad = tmp_path / "bad"
    bad.mkdir()
    assert _run("doctor", "--model", str(bad)).returncode == 1
    # With --recipe as well, the recipe must fit too.
    assert _run("doctor", "--model", str(good), "--recipe", "gemma4-moe-dflash").returncode == 1
