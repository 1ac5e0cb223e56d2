"""One exit-code table for every command, in `launcher --help` and the README (issue 57, items 4 and 6)."""

from __future__ import annotations

import json
import re
import os
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from launcher.cli import app
from launcher.errors import EXIT_CODES_TABLE, EXIT_PROBLEMS, EXIT_REFUSED, EXIT_TIMEOUT
from launcher.runtime import native

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = Path(sys.executable).with_name("launcher")


def run(*args, env=None):
    return subprocess.run([str(LAUNCHER), *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def test_the_table_is_in_the_help_and_the_readme():
    res = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "80"}, terminal_width=80)
    assert EXIT_CODES_TABLE.splitlines()[0] in res.output
    for row in EXIT_CODES_TABLE.splitlines()[1:]:
        assert row.strip() in res.output, row  # click indents the epilog
    assert EXIT_CODES_TABLE in (ROOT / "README.md").read_text()


def test_a_dry_run_of_a_blocked_plan_exits_0_and_says_blocked(tmp_path):
    env = {"MODELS_DIR": str(tmp_path)}
    text = run("serve", "--recipe", "gemma4-moe-dflash", "--dry-run", env=env)
    assert text.returncode == 0, text.stderr
    assert "verdict       BLOCKED" in text.stdout
    as_json = run("serve", "--recipe", "gemma4-moe-dflash", "--dry-run", "--json", env=env)
    assert as_json.returncode == 0 and json.loads(as_json.stdout)["verdict"] == "blocked"


def test_a_blocked_serve_is_a_refusal_and_doctor_a_check(tmp_path):
    env = {"MODELS_DIR": str(tmp_path)}
    assert run("serve", "--recipe", "gemma4-moe-dflash", env=env).returncode == EXIT_REFUSED
    assert run("doctor", "--recipe", "gemma4-moe-dflash", env=env).returncode == EXIT_PROBLEMS
    assert run("serve", "--recipe", "no-such-recipe", "--dry-run", env=env).returncode == EXIT_REFUSED


def test_a_wait_that_runs_out_is_124():
    assert EXIT_TIMEOUT == 124 and native.EXIT_NOT_READY == EXIT_TIMEOUT


def test_make_serve_dry_run_exits_0_after_the_plan(tmp_path):
    venv = Path(sys.executable).parent.parent  # -o: used as it is, never rebuilt (test_cli.py says why)
    res = subprocess.run(["make", "-s", "-o", f"{venv}/.deps-stamp", "serve", "ARGS=--dry-run", f"VENV={venv}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "MODELS_DIR": str(tmp_path)})
    assert res.returncode == 0, res.stdout + res.stderr
    assert "vllm serve" in res.stdout and "verdict       BLOCKED" in res.stdout


def test_bare_make_prints_help_listing_every_target():
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][a-z0-9-]*):", makefile, re.M))
    res = subprocess.run(["make", "-s"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout == subprocess.run(["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True,
                                        timeout=60).stdout
    listed = set(re.findall(r"\bmake ([a-z][a-z0-9-]*)", res.stdout))
    assert targets - listed == set(), "targets without a `## make` line"
    assert {"serve", "test", "help"} <= targets


def test_ctrl_c_while_the_cli_starts_is_one_line_and_exits_by_sigint():
    """A SIGINT during the imports (about 0.3 s after start) printed a KeyboardInterrupt traceback."""
    import signal
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", "import launcher.cli\nraise KeyboardInterrupt"],
                          capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})
    assert "Traceback" not in proc.stderr
    assert proc.stderr == "error: interrupted (SIGINT) while starting; nothing was done\n"
    assert proc.returncode == -signal.SIGINT  # the shell reports 130
