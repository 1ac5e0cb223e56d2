"""MSVC's environment for a Windows build, found and loaded by the launcher (build.ps1 only starts it).

No Windows machine exists here: vswhere.exe and cmd.exe are played by a
recorder that answers as they do (vswhere prints the installation folder,
`vcvars64.bat >nul && set` prints NAME=value lines); the paths are
PureWindowsPath values, built as on Windows.
"""

from __future__ import annotations

import re
import subprocess

import pytest

from launcher.builder import msvc
from launcher.errors import LauncherError

INSTALL = r"C:\Program Files\Microsoft Visual Studio\2022\BuildTools"
SET_OUTPUT = ("**********************************************************************\n"
              "** Visual Studio 2022 Developer Command Prompt v17.12\n"
              r"INCLUDE=C:\VS\VC\Tools\MSVC\14.42\include;C:\Kits\10\include" "\n"
              r"PATH=C:\VS\VC\Tools\MSVC\14.42\bin\Hostx64\x64;C:\Windows" "\n"
              "VSCMD_ARG_TGT_ARCH=x64\n")


class Recorder:
    def __init__(self, install=INSTALL, set_output=SET_OUTPUT, code=0):
        self.calls, self.install, self.set_output, self.code = [], install, set_output, code

    def __call__(self, command, **kw):
        self.calls.append(command)
        if isinstance(command, list):  # vswhere
            return subprocess.CompletedProcess(command, 0, self.install + "\n", "")
        return subprocess.CompletedProcess(command, self.code, self.set_output, "")


ENVIRON = {"ProgramFiles(x86)": r"C:\Program Files (x86)"}
VSWHERE = r"C:\Program Files (x86)\Microsoft Visual Studio\Installer\vswhere.exe"


def test_vcvars_of_the_newest_vs_with_the_x64_tools_is_loaded():
    run = Recorder()
    env = msvc.environment(ENVIRON, run=run, exists=lambda p: p == VSWHERE)
    assert run.calls[0] == [VSWHERE, "-latest", "-products", "*", "-requires", msvc.VC_TOOLS,
                            "-property", "installationPath"]
    bat = INSTALL + r"\VC\Auxiliary\Build\vcvars64.bat"
    assert run.calls[1] == f'cmd.exe /d /s /c ""{bat}" >nul && set"'
    assert env["INCLUDE"].startswith(r"C:\VS\VC\Tools\MSVC") and env["VSCMD_ARG_TGT_ARCH"] == "x64"
    assert not any(k.startswith("*") for k in env)  # the banner is not a variable


def test_a_developer_prompt_loads_nothing():
    run = Recorder()
    assert msvc.environment({**ENVIRON, "VSCMD_ARG_TGT_ARCH": "x64"}, run=run, exists=lambda p: True) == {}
    assert run.calls == []


@pytest.mark.parametrize("exists, run, message", [
    (lambda p: False, Recorder(), "vswhere.exe not found"),
    (lambda p: True, Recorder(install=""), "no Visual Studio with the x64 C++ tools"),
    (lambda p: True, Recorder(set_output="", code=1), "did not set up MSVC (exit 1)"),
])
def test_what_is_missing_is_named(exists, run, message):
    with pytest.raises(LauncherError, match=re.escape(message)):
        msvc.environment(ENVIRON, run=run, exists=exists)


def test_prepare_fills_the_environment_and_warns_about_long_paths():
    environ, said = dict(ENVIRON), []
    msvc.prepare(environ, said.append, run=Recorder(), exists=lambda p: True, long_paths=lambda: False)
    assert environ["VSCMD_ARG_TGT_ARCH"] == "x64" and environ["PATH"].startswith(r"C:\VS")
    assert said[0].startswith("MSVC: loaded the x64 environment")
    assert said[1].startswith("warning: long paths are off") and "LongPathsEnabled 1" in said[1]
    quiet = []
    msvc.prepare(dict(environ), quiet.append, run=Recorder(), exists=lambda p: True, long_paths=lambda: True)
    assert quiet == []  # a Developer environment now, and long paths on
