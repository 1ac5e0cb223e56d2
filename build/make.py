"""The Makefile's `serve`, `dry-run`, `test`, `venv` and `test-venv` targets without make.

Windows has no make: ``build\\make.ps1`` finds a Python and runs this file, which
does what those targets do, with the same variables written the same way::

    build\\make.ps1 serve                                 # make serve
    build\\make.ps1 serve ARGS=--dry-run RECIPE=gemma4-e4b  # make serve ARGS=--dry-run RECIPE=gemma4-e4b
    build\\make.ps1 test PYTEST_ARGS="-x tests/unit"        # make test PYTEST_ARGS="-x tests/unit"

It runs anywhere (``python3 build/make.py serve`` on Linux too); ``--print`` shows
the commands and runs none (as ``make -n``). Standard library only: it runs
before the venv exists. tests/unit/test_make_py.py checks that its commands are
the Makefile's.

On Windows, ``test`` cannot run tests/engines.sh (bash, apt, dockerd as root):
it deselects the tests that need the Docker daemon and its local base images
(``-m "not docker"``) and says so; ``PYTEST_ARGS`` comes after, so a ``-m`` there wins.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path, PurePosixPath, PureWindowsPath

REPO = Path(__file__).resolve().parents[1]
TARGETS = ("help", "venv", "test-venv", "test", "serve", "dry-run")
VARIABLES = ("PYTHON", "VENV", "RECIPE", "VLLM_PYTHON", "ARGS", "PYTEST_ARGS", "TEST_WORKERS")
# Kept equal to the Makefile's $(TEST_STAMP) recipe (tests/unit/test_make_py.py compares them).
TEST_EXTRAS = [["-m", "pip", "install", "-q", "-e", ".[test,quantize]", "torch==2.13.0"],
               ["-m", "pip", "install", "-q", "--no-deps", "dflash==0.1.0"]]
HELP = """usage: build/make.ps1 TARGET [NAME=VALUE ...] [--print]    (python build/make.py ... anywhere)
  serve      make serve: serve RECIPE (default gemma4-moe-dflash); blocked: the plan, exit 2
  dry-run    make dry-run: the plan and preflight, starts nothing, exits 0
  test       make test: unit + integration tests (PYTEST_ARGS=...)
  venv       make venv: .venv with the launcher alone
  test-venv  make test-venv: .venv with the test extras too
NAME: PYTHON (makes the venv), VENV (.venv), RECIPE, VLLM_PYTHON (the vLLM to serve), ARGS
(more launcher serve arguments), PYTEST_ARGS, TEST_WORKERS (pytest-xdist workers, 3). --print: show the commands, run none."""


class Usage(Exception):
    pass


def parse(argv: list[str], environ: dict[str, str]) -> tuple[str, dict[str, str], bool]:
    """(target, variables, print only) from ``TARGET NAME=VALUE ...``; variables default as in the Makefile."""
    words = [w for w in argv if w != "--print"]
    dry = len(words) != len(argv)
    target = words[0] if words else "help"
    if target not in TARGETS:
        raise Usage(f"unknown target {target!r}: one of {', '.join(TARGETS)}")
    values = {"PYTHON": environ.get("PYTHON") or ("python" if os.name == "nt" else "python3"),
              "VENV": environ.get("VENV") or ".venv", "RECIPE": environ.get("RECIPE") or "gemma4-moe-dflash",
              "VLLM_PYTHON": environ.get("VLLM_PYTHON", ""), "ARGS": environ.get("ARGS", ""),
              "PYTEST_ARGS": environ.get("PYTEST_ARGS", ""), "TEST_WORKERS": environ.get("TEST_WORKERS", "3")}
    for word in words[1:]:
        name, eq, value = word.partition("=")
        if not eq or name not in VARIABLES:
            raise Usage(f"{word!r}: arguments are NAME=VALUE with NAME one of {', '.join(VARIABLES)} "
                        f"(more serve arguments: ARGS=\"...\")")
        values[name] = value
    return target, values, dry


def _split(text: str, windows: bool) -> list[str]:
    # Windows quoting rules differ, but "..." around a value with spaces is what both shells pass on.
    return shlex.split(text, posix=not windows) if text else []


class Plan:
    """The commands of a target, in order; a command is (argv, stamp it makes or None)."""

    def __init__(self, values: dict[str, str], windows: bool, repo: Path = REPO):
        self.values, self.windows, self.repo = values, windows, repo
        path = PureWindowsPath if windows else PurePosixPath
        venv = path(values["VENV"])
        self.bin = venv / ("Scripts" if windows else "bin")
        self.python = str(self.bin / ("python.exe" if windows else "python"))
        self.launcher = str(self.bin / ("launcher.exe" if windows else "launcher"))
        self.stamp, self.test_stamp = str(venv / ".deps-stamp"), str(venv / ".test-deps-stamp")

    def _stale(self, stamp: str, *inputs: str) -> bool:
        made = self.repo / stamp
        if not made.exists():
            return True
        return any((self.repo / i).exists() and (self.repo / i).stat().st_mtime > made.stat().st_mtime
                   for i in inputs)

    def venv(self) -> list[tuple[list[str], str | None]]:
        if not self._stale(self.stamp, "pyproject.toml"):
            return []
        return [([self.values["PYTHON"], "-m", "venv", self.values["VENV"]], None),
                ([self.python, "-m", "pip", "install", "-q", "-e", "."], self.stamp)]

    def test_venv(self) -> list[tuple[list[str], str | None]]:
        steps = self.venv()
        if steps or self._stale(self.test_stamp, self.stamp, "Makefile"):
            steps += [([self.python, *TEST_EXTRAS[0]], None), ([self.python, *TEST_EXTRAS[1]], self.test_stamp)]
        return steps

    def serve(self, dry_run: bool = False) -> list[tuple[list[str], str | None]]:
        vllm = ["--vllm-python", self.values["VLLM_PYTHON"]] if self.values["VLLM_PYTHON"] else []
        extra = ["--dry-run"] if dry_run else []
        return self.venv() + [([self.launcher, "serve", "--recipe", self.values["RECIPE"], *vllm, *extra,
                                *_split(self.values["ARGS"], self.windows)], None)]

    def xdist(self) -> list[str]:
        """The Makefile's $(XDIST): pytest-xdist workers, each file whole to one."""
        return ["-n", self.values["TEST_WORKERS"], "--dist", "loadfile", "--no-loadscope-reorder"]

    def test(self) -> list[tuple[list[str], str | None]]:
        steps = self.test_venv()
        if self.windows:
            steps.append(([self.python, "-m", "pytest", "-m", "not docker", *self.xdist(),
                           *_split(self.values["PYTEST_ARGS"], True)], None))
        else:
            steps += [(["bash", "tests/engines.sh"], None),
                      ([self.python, "-m", "pytest", *self.xdist(), *_split(self.values["PYTEST_ARGS"], False)],
                       None)]
        return steps

    def steps(self, target: str) -> list[tuple[list[str], str | None]]:
        return {"venv": self.venv, "test-venv": self.test_venv, "test": self.test, "serve": self.serve,
                "dry-run": lambda: self.serve(dry_run=True)}[target]()


def render(argv: list[str], windows: bool) -> str:
    return subprocess.list2cmdline(argv) if windows else shlex.join(argv)


def main(argv: list[str] | None = None, environ: dict[str, str] | None = None) -> int:
    try:
        target, values, dry = parse(sys.argv[1:] if argv is None else argv,
                                    dict(os.environ) if environ is None else environ)
    except Usage as exc:
        print(f"error: {exc}\n{HELP}", file=sys.stderr)
        return 2
    if target == "help":
        print(HELP)
        return 0
    windows = os.name == "nt"
    if target == "test" and windows:
        print("make.py: tests/engines.sh (the Docker daemon and its base images) is Linux-only: "
              "the docker tests are left out (-m \"not docker\")", file=sys.stderr)
    for command, stamp in Plan(values, windows).steps(target):
        print(render(command, windows), flush=True)
        if dry:
            continue
        code = subprocess.run(command, cwd=REPO).returncode
        if code != 0:
            return code  # launcher serve's own code (2 blocked, 124 timeout, ...), as make passes it on
        if stamp:
            (REPO / stamp).touch()
    return 0


if __name__ == "__main__":
    sys.exit(main())
