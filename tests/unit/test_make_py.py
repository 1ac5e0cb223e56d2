"""build/make.py (and its Windows wrapper build/make.ps1): the Makefile's serve and test without make.

PowerShell is not on the test machines, so the wrapper is read, not run; what it
runs, build/make.py, is run here: on the POSIX layout its commands must be the ones
`make -n` prints for the same target and variables (a scratch copy of the Makefile,
with and without the venv's stamps), and the Windows layout must be the same
commands with `Scripts\\*.exe`.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("make_py", REPO / "build" / "make.py")
make_py = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_py)

CASES = [
    ("serve", []),
    ("serve", ["RECIPE=gemma4-e4b", "ARGS=--dry-run --port 9000", "VLLM_PYTHON=/opt/vllm/bin/python"]),
    ("dry-run", ["RECIPE=gemma4-moe"]),
    ("venv", []),
    ("test-venv", []),
    ("test", []),
    ("test", ["PYTEST_ARGS=-x -q tests/unit"]),
    ("test", ["TEST_WORKERS=0", "PYTEST_ARGS=tests/unit"]),
]


def _scratch(tmp_path: Path, stamps: bool) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy2(REPO / name, root / name)
    if stamps:  # a venv made after both inputs: make has nothing to rebuild
        (root / ".venv").mkdir()
        later = max((root / n).stat().st_mtime for n in ("Makefile", "pyproject.toml")) + 10
        for stamp in (".deps-stamp", ".test-deps-stamp"):
            (root / ".venv" / stamp).touch()
            os.utime(root / ".venv" / stamp, (later, later))
    return root


def _ours(root: Path, target: str, variables: list[str], windows: bool) -> list[list[str]]:
    parsed_target, values, _ = make_py.parse([target, *variables], {})
    plan = make_py.Plan(values, windows=windows, repo=root)
    return [argv for argv, _ in plan.steps(parsed_target)]


@pytest.mark.skipif(shutil.which("make") is None, reason="GNU make is what this compares against")
@pytest.mark.parametrize("stamps", [False, True], ids=["fresh-clone", "venv-made"])
@pytest.mark.parametrize(("target", "variables"), CASES, ids=lambda c: c if isinstance(c, str) else " ".join(c))
def test_the_commands_are_the_makefiles(tmp_path, target, variables, stamps):
    root = _scratch(tmp_path, stamps)
    env = {k: v for k, v in os.environ.items() if k not in make_py.VARIABLES and not k.startswith("MAKE")}
    made = subprocess.run(["make", "-s", "-n", "-C", str(root), target, *variables], capture_output=True, text=True,
                          env=env, check=True).stdout.splitlines()
    # Compared word by word, as the shell splits make's lines; make.py touches the stamps itself.
    made = [shlex.split(line) for line in made if not line.startswith("touch ")]
    assert _ours(root, target, variables, windows=False) == made


@pytest.mark.parametrize(("target", "variables"), CASES, ids=lambda c: c if isinstance(c, str) else " ".join(c))
def test_the_windows_commands_are_the_same_with_scripts_exe(tmp_path, target, variables):
    root = _scratch(tmp_path, stamps=False)
    posix = _ours(root, target, variables, windows=False)
    windows = _ours(root, target, variables, windows=True)
    exe = {".venv/bin/python": r".venv\Scripts\python.exe", ".venv/bin/launcher": r".venv\Scripts\launcher.exe"}
    expected = [[exe.get(word, word) for word in argv] for argv in posix]
    assert expected != posix or target == "venv" and not posix
    if target == "test":
        # No bash, apt or dockerd as root there: no engines.sh, and the docker tests are left out.
        expected.remove(["bash", "tests/engines.sh"])
        at = expected[-1].index("pytest") + 1
        expected[-1][at:at] = ["-m", "not docker"]
    assert windows == expected
    # What make.ps1 prints: each command as Windows' own quoting joins it.
    assert make_py.render(windows[-1], True).startswith(".venv\\Scripts\\") or target == "venv"


def test_variables_are_name_value_and_anything_else_is_refused():
    target, values, dry = make_py.parse(["serve", "ARGS=--wait --timeout 60", "--print"], {"RECIPE": "gemma4-e4b"})
    assert (target, values["RECIPE"], values["ARGS"], dry) == ("serve", "gemma4-e4b", "--wait --timeout 60", True)
    assert make_py.parse([], {})[0] == "help"
    with pytest.raises(make_py.Usage, match="unknown target 'bench'"):
        make_py.parse(["bench"], {})
    with pytest.raises(make_py.Usage, match="'--dry-run': arguments are NAME=VALUE"):
        make_py.parse(["serve", "--dry-run"], {})
    with pytest.raises(make_py.Usage, match="'TARGET=x'"):
        make_py.parse(["serve", "TARGET=x"], {})


def test_serve_passes_the_launchers_exit_code_on(tmp_path):
    """A blocked serve exits 2 through make.py as through make; the arguments reach the launcher."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    later = (REPO / "pyproject.toml").stat().st_mtime + 10
    (venv / ".deps-stamp").touch()
    os.utime(venv / ".deps-stamp", (later, later))
    seen = tmp_path / "argv"
    launcher = venv / "bin" / "launcher"
    launcher.write_text(f'#!/bin/sh\necho "$@" > {seen}\nexit 2\n')
    launcher.chmod(0o755)
    proc = subprocess.run([sys.executable, str(REPO / "build" / "make.py"), "serve", f"VENV={venv}",
                           "ARGS=--dry-run --port 9000"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert seen.read_text().split() == ["serve", "--recipe", "gemma4-moe-dflash", "--dry-run", "--port", "9000"]
    assert proc.stdout.splitlines() == [f"{launcher} serve --recipe gemma4-moe-dflash --dry-run --port 9000"]


def test_make_ps1_only_finds_python_and_runs_make_py():
    text = (REPO / "build" / "make.ps1").read_text()
    code = [line for line in text.split("#>", 1)[1].splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert '$MakePy = Join-Path $PSScriptRoot "make.py"' in text
    assert "& $Exe @PyArgs $MakePy @args" in text and code[-1] == "exit $LASTEXITCODE"
    assert len(code) <= 15
    # The README's Windows lines are the two commands, through the wrapper.
    readme = (REPO / "README.md").read_text()
    assert r"build\make.ps1 serve" in readme and r"build\make.ps1 test" in readme
