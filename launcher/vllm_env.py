"""The vLLM a native ``serve`` will run: its interpreter, inspected before the start.

The launcher may live in one Python (``make serve`` builds a venv without
vLLM) while vLLM lives in another. Planning against the launcher's own
packages and then starting whatever ``vllm`` comes first on ``PATH`` checks
one vLLM and runs another. So the interpreter is resolved once, asked for its
vLLM version, transformers version and package folder (a subprocess that
reads metadata only: importing vLLM costs seconds and needs a GPU stack), and
the native runtime starts exactly that interpreter
(``python -m vllm.entrypoints.cli.main serve ...``, which is what the
``vllm`` console script runs).

Order: ``--vllm-python`` (or ``$VLLM_PYTHON``; ``make serve VLLM_PYTHON=...``), then the
launcher's own interpreter when it has vLLM, then the interpreter behind the
first ``vllm`` on ``PATH`` (its ``#!`` line on POSIX, the venv's
``python.exe`` beside ``Scripts\\vllm.exe`` on Windows).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from launcher.errors import LauncherError

_TRAMPOLINE = re.compile(r"^'''exec' (?:\"([^\"]+)\"|(\S+)) ")

# Runs inside the target interpreter: metadata and find_spec only, nothing imported.
_PROBE = r"""
import json, sys
from importlib import metadata, util
def version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
spec = util.find_spec("vllm")
locations = list(spec.submodule_search_locations or []) if spec else []
print(json.dumps({"python": sys.executable, "vllm": version("vllm"),
                  "transformers": version("transformers"), "ray": version("ray"),
                  "package": locations[0] if locations else None}))
"""


@dataclass(frozen=True)
class VllmEnv:
    """One Python environment as seen from outside: what it would run."""

    python: str  # the interpreter the runtime starts
    source: str  # why this one: "--vllm-python", "launcher's Python", "`vllm` on PATH (...)"
    vllm_version: str | None
    transformers_version: str | None
    package_dir: str | None  # the vllm package folder (for the patch status)
    #: why no vLLM could be read from what was found (a wrapper script, an interpreter that failed)
    problem: str | None = None
    #: Ray, which vLLM does not depend on but its Ray executor imports (multi-node on Ray)
    ray_version: str | None = None

    @property
    def has_vllm(self) -> bool:
        return bool(self.vllm_version and self.package_dir)


def inspect(python: str, source: str) -> VllmEnv:
    """Ask ``python`` for its vLLM; LauncherError when it cannot be run at all."""
    try:
        proc = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LauncherError(f"cannot run the Python {python} ({source}): {exc}",
                            hint="pass --vllm-python with the python of the environment that has vLLM") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise LauncherError(f"the Python {python} ({source}) failed to report its packages: {last}", hint=_HINT)
    data = _probe_answer(proc.stdout)
    if data is None:
        shown = proc.stdout.strip()[:120]
        raise LauncherError(f"{python} ({source}) is not a Python that reports its packages: given the probe, "
                            f"it printed {repr(shown) if shown else 'nothing'}", hint=_HINT)
    return VllmEnv(python=data["python"] or python, source=source, vllm_version=data["vllm"],
                   transformers_version=data["transformers"], package_dir=data["package"],
                   ray_version=data.get("ray") if isinstance(data.get("ray"), str) else None)


_HINT = "pass --vllm-python with the python executable of the environment that has vLLM (e.g. /opt/vllm/bin/python)"


def _probe_answer(stdout: str) -> dict | None:
    """The probe's JSON line; None for anything else (``/bin/true`` prints nothing, a wrapper prints text)."""
    lines = stdout.strip().splitlines()
    try:
        data = json.loads(lines[-1]) if lines else None
    except ValueError:
        return None
    keys = {"python", "vllm", "transformers", "package"}
    if not isinstance(data, dict) or not keys <= data.keys():
        return None
    if not all(v is None or isinstance(v, str) for v in (data[k] for k in keys)):
        return None
    return data


def resolve(python: str | None = None, *, environ: dict[str, str] | None = None) -> VllmEnv | None:
    """The environment native serve runs; None when no vLLM is found anywhere."""
    if python:
        found = shutil.which(python) or python
        if Path(found).is_dir():
            raise LauncherError(f"--vllm-python {python} is a folder, not a Python executable",
                                hint=f"give the python inside it, e.g. {Path(python) / 'bin' / 'python'}")
        if not Path(found).is_file():
            raise LauncherError(f"--vllm-python {python}: no such file",
                                hint="give the python executable of the environment that has vLLM")
        return inspect(found, "--vllm-python")
    own = _own()
    if own.has_vllm:
        return own
    script = shutil.which("vllm", path=(environ or os.environ).get("PATH"))
    if script:
        return _behind_script(Path(script))
    return None


def _behind_script(script: Path) -> VllmEnv:
    """The environment behind a ``vllm`` on PATH; what was found there when it is not one."""
    source = f"`vllm` on PATH: {script}"
    interpreter = script_interpreter(script)
    if interpreter is None or not _looks_like_python(interpreter):
        what = f"a script run by {interpreter}" if interpreter else "not a Python console script"
        problem = (f"{script} is {what}, so the Python whose vLLM it starts is unknown; {_HINT}")
        return VllmEnv(python=str(script), source=source, vllm_version=None, transformers_version=None,
                       package_dir=None, problem=problem)
    try:
        return inspect(interpreter, source)
    except LauncherError as exc:
        return VllmEnv(python=interpreter, source=source, vllm_version=None, transformers_version=None,
                       package_dir=None, problem=f"{exc.message}; {_HINT}")


def _looks_like_python(interpreter: str) -> bool:
    # python, python3, python3.12, python.exe, pypy3: what pip writes on a console script's #! line
    return re.match(r"^(python|pypy)[\d.]*(\.exe)?$", Path(interpreter).name, re.I) is not None


def _own() -> VllmEnv:
    """The launcher's own interpreter, read in-process (no subprocess for every plan)."""
    from importlib import util

    from launcher import versions

    spec = util.find_spec("vllm")
    locations = list(spec.submodule_search_locations or []) if spec else []
    return VllmEnv(python=sys.executable, source="the launcher's Python", vllm_version=versions.installed("vllm"),
                   transformers_version=versions.installed("transformers"),
                   package_dir=locations[0] if locations else None, ray_version=versions.installed("ray"))


def script_interpreter(script: Path) -> str | None:
    """The Python a ``vllm`` console script runs: its ``#!`` line, or python.exe beside it."""
    if os.name == "nt":  # Scripts\vllm.exe is a launcher stub; the venv's python.exe sits beside it
        beside = script.parent / "python.exe"
        return str(beside) if beside.is_file() else None
    try:
        with open(script, "rb") as fh:
            head = fh.read(4096).decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    if not head or not head[0].startswith("#!"):
        return None
    # pip writes `#!/bin/sh` and an exec line when the interpreter's path is too long for `#!`.
    trampoline = _TRAMPOLINE.match(head[1]) if len(head) > 1 else None
    if trampoline:
        return trampoline.group(1) or trampoline.group(2)
    words = head[0][2:].split()
    if not words:
        return None
    if Path(words[0]).name == "env" and len(words) > 1:  # #!/usr/bin/env python3
        return shutil.which(words[-1])
    return words[0]
