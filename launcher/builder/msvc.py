"""MSVC for a native Windows build: found with vswhere, its x64 environment read from vcvars64.bat.

A build on Windows needs cl.exe and its INCLUDE/LIB/PATH, which only a
"Developer" prompt has. vcvars64.bat sets them in a cmd.exe; ``set`` printed
after it carries them back, and the launcher puts them into its own
environment before the preflight looks for cl.exe and the build runs. Where
the prompt is a Developer one already (VSCMD_ARG_TGT_ARCH=x64), nothing is
loaded. Paths are PureWindowsPath values, so all but the two commands is
tested on Linux.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Mapping
from pathlib import PureWindowsPath

from launcher.errors import LauncherError

VSWHERE_REL = r"Microsoft Visual Studio\Installer\vswhere.exe"
VC_TOOLS = "Microsoft.VisualStudio.Component.VC.Tools.x86.x64"
LONG_PATHS_KEY = r"SYSTEM\CurrentControlSet\Control\FileSystem"
LONG_PATHS_HINT = (r"as admin: Set-ItemProperty HKLM:\SYSTEM\CurrentControlSet\Control\FileSystem LongPathsEnabled 1; "
                   r"git config --system core.longpaths true; or keep --work-dir short (e.g. C:\b)")

Run = Callable[..., subprocess.CompletedProcess]


def vswhere(environ: Mapping[str, str]) -> PureWindowsPath:
    """Where the Visual Studio Installer puts vswhere.exe."""
    base = environ.get("ProgramFiles(x86)") or r"C:\Program Files (x86)"
    return PureWindowsPath(base) / VSWHERE_REL


def vcvars(installation: str) -> PureWindowsPath:
    return PureWindowsPath(installation) / "VC" / "Auxiliary" / "Build" / "vcvars64.bat"


def vcvars_command(bat: PureWindowsPath) -> str:
    """One cmd.exe line: vcvars64.bat quietly, then the environment it left (/s keeps the quotes as written)."""
    return f'cmd.exe /d /s /c ""{bat}" >nul && set"'


def parse_set(text: str) -> dict[str, str]:
    """``set``'s output (NAME=value a line) as a dict; lines without '=' (a banner) are skipped."""
    out = {}
    for line in text.splitlines():
        name, eq, value = line.partition("=")
        if eq and name and not name.startswith(" "):
            out[name] = value
    return out


def environment(environ: Mapping[str, str], *, run: Run = subprocess.run,
                exists: Callable[[str], bool] = os.path.exists) -> dict[str, str]:
    """The variables vcvars64.bat sets (all of ``set``'s output); {} in a Developer prompt already."""
    if environ.get("VSCMD_ARG_TGT_ARCH", "").lower() == "x64":
        return {}
    tool = vswhere(environ)
    if not exists(str(tool)):
        raise LauncherError(f"vswhere.exe not found at {tool}",
                            hint="install Visual Studio 2022 Build Tools with 'Desktop development with C++'")
    found = run([str(tool), "-latest", "-products", "*", "-requires", VC_TOOLS, "-property", "installationPath"],
                capture_output=True, text=True)
    installation = found.stdout.strip().splitlines()[0] if found.stdout.strip() else ""
    if not installation:
        raise LauncherError("no Visual Studio with the x64 C++ tools",
                            hint="add 'Desktop development with C++' in the Visual Studio Installer")
    bat = vcvars(installation)
    loaded = run(vcvars_command(bat), capture_output=True, text=True)
    env = parse_set(loaded.stdout) if loaded.returncode == 0 else {}
    if "INCLUDE" not in env:
        last = (loaded.stderr or loaded.stdout or "").strip().splitlines()[-1:] or ["no output"]
        raise LauncherError(f"{bat} did not set up MSVC (exit {loaded.returncode}): {last[0]}")
    return env


def long_paths_enabled() -> bool | None:
    """HKLM's LongPathsEnabled; None where there is no registry to read (not Windows)."""
    try:
        import winreg
    except ImportError:
        return None
    try:
        with winreg.OpenKey(winreg.HKEY_LOCAL_MACHINE, LONG_PATHS_KEY) as key:
            return winreg.QueryValueEx(key, "LongPathsEnabled")[0] == 1
    except OSError:
        return False


def prepare(environ: dict[str, str], echo, *, run: Run = subprocess.run, exists=os.path.exists,
            long_paths: Callable[[], bool | None] = long_paths_enabled) -> None:
    """Load MSVC's environment into ``environ`` (the launcher's own) and warn when long paths are off."""
    loaded = environment(environ, run=run, exists=exists)
    if loaded:
        environ.update(loaded)
        echo(f"MSVC: loaded the x64 environment of vcvars64.bat ({len(loaded)} variables)")
    if long_paths() is False:
        echo(f"warning: long paths are off; the build may fail on deep paths ({LONG_PATHS_HINT})")
