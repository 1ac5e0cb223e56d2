"""`launcher install`'s plan for a Windows host, checked on Linux.

A Windows machine cannot exist here: its paths are PureWindowsPath values, and
which files exist is a set of those paths given to the plan. Everything the
plan decides (the venv's Scripts\\python.exe, the wheel's version, pip's
command line, cmd.exe quoting) is computed as on Windows.
"""

from __future__ import annotations

from pathlib import PurePosixPath, PureWindowsPath

import pytest

from launcher import recipe as recipes
from launcher.errors import LauncherError
from launcher.vllm_install import choose_version, next_steps, plan_install, venv_python, wheel_version

W = PureWindowsPath
VENV = W(r"C:\Users\Ann Lee\vllm-venv")
DOWNLOADS = W(r"C:\Users\Ann Lee\Downloads")
WHEEL_29 = DOWNLOADS / "vllm-0.29.0+cu132-cp312-cp312-win_amd64.whl"
WHEEL_26 = DOWNLOADS / "vllm-0.26.0+cu128-cp312-cp312-win_amd64.whl"


def windows_plan(existing: set, **kw):
    names = {str(p) for p in existing}

    def listdir(folder: str) -> list[str]:
        return [W(n).name for n in names if str(W(n).parent) == folder]

    args = dict(recipe=recipes.load("gemma4-moe-dflash"), version=None, venv=VENV, vllm_python=None, wheel=None,
                offline=False, pip_args=[], windows=True, own_python=W(r"C:\src\vllm-sm12x\.venv\Scripts\python.exe"),
                own_is_venv=True, exists=lambda p: p in names, listdir=listdir)
    args.update(kw)
    return plan_install(**args)


def test_a_windows_venv_runs_scripts_python_exe():
    assert venv_python(VENV) == W(r"C:\Users\Ann Lee\vllm-venv\Scripts\python.exe")
    assert venv_python(PurePosixPath("/opt/vllm")) == PurePosixPath("/opt/vllm/bin/python")


def test_the_version_comes_from_a_windows_wheel_name():
    assert wheel_version(WHEEL_29) == "0.29.0+cu132"
    with pytest.raises(LauncherError, match="not a wheel file name"):
        wheel_version(W(r"C:\dl\vllm.zip"))
    with pytest.raises(LauncherError, match="a wheel of torch, not of vllm"):
        wheel_version(W(r"C:\dl\torch-2.11.0-cp312-cp312-win_amd64.whl"))


def test_windows_without_a_wheel_is_refused_with_where_to_get_one():
    with pytest.raises(LauncherError, match="PyPI has no vLLM wheel for Windows") as err:
        windows_plan(set())
    assert "SystemPanic/vllm-windows" in err.value.hint


def test_a_windows_wheel_into_a_new_venv():
    plan = windows_plan({DOWNLOADS, WHEEL_29}, wheel=WHEEL_29)
    assert plan.version == "0.29.0" and plan.create_venv == VENV
    assert plan.python == W(r"C:\Users\Ann Lee\vllm-venv\Scripts\python.exe")
    assert plan.pip == [r"C:\Users\Ann Lee\vllm-venv\Scripts\python.exe", "-m", "pip", "install", str(WHEEL_29)]
    # cmd.exe / PowerShell quoting, not POSIX quotes.
    assert (r'step 2        "C:\Users\Ann Lee\vllm-venv\Scripts\python.exe" -m pip install '
            r'"C:\Users\Ann Lee\Downloads\vllm-0.29.0+cu132-cp312-cp312-win_amd64.whl"') in plan.lines()
    assert next_steps(plan, W(r"C:\src\.venv\Scripts\python.exe"))[1] == \
        r'      launcher serve --recipe gemma4-moe-dflash --vllm-python "C:\Users\Ann Lee\vllm-venv\Scripts\python.exe"'


def test_a_folder_of_wheels_takes_the_newest_supported_one_offline():
    plan = windows_plan({DOWNLOADS, WHEEL_26, WHEEL_29, VENV, venv_python(VENV)}, wheel=DOWNLOADS, offline=True)
    assert plan.version == "0.29.0" and plan.create_venv is None  # the venv is there
    assert plan.pip[3:] == ["install", "--no-index", "--find-links", str(DOWNLOADS), "vllm==0.29.0"]
    older = windows_plan({DOWNLOADS, WHEEL_26, WHEEL_29}, wheel=DOWNLOADS, version="0.26.0")
    assert older.pip[-1] == "vllm==0.26.0"


def test_a_folder_that_is_not_a_venv_is_refused():
    with pytest.raises(LauncherError, match="holds no venv"):
        windows_plan({DOWNLOADS, WHEEL_29, VENV, VENV / "notes.txt"}, wheel=WHEEL_29)


def test_the_launchers_own_python_outside_a_venv_is_refused():
    with pytest.raises(LauncherError, match="is not a venv"):
        windows_plan({WHEEL_29}, wheel=WHEEL_29, venv=None, own_is_venv=False)


def test_newest_supported_release_by_version_order_not_text():
    rec = recipes.load("gemma4-moe-dflash")
    assert choose_version(rec, None) == "0.33.0"
    assert choose_version(rec, None, ["0.21.0+cu132", "0.9.0"]) == "0.21.0"


def test_next_steps_repeat_a_recipe_file_as_given():
    linux = DOWNLOADS / "vllm-0.29.0-cp38-abi3-manylinux_2_31_x86_64.whl"
    plan = windows_plan({DOWNLOADS, linux}, wheel=linux, windows=False, venv=PurePosixPath("/opt/v"),
                        own_python=PurePosixPath("/src/.venv/bin/python"))
    steps = next_steps(plan, PurePosixPath("/src/.venv/bin/python"), "/home/ann/my recipes/r.yaml")
    assert steps == ["next: launcher models pull --recipe '/home/ann/my recipes/r.yaml'",
                     "      launcher serve --recipe '/home/ann/my recipes/r.yaml' --vllm-python /opt/v/bin/python"]


def _linux_plan(tmp_path, **kw):
    import os
    import sys
    from pathlib import Path

    args = dict(recipe=recipes.load("gemma4-moe-dflash"), version=None, venv=tmp_path / "venv", vllm_python=None,
                wheel=None, offline=False, pip_args=[], windows=False, own_python=Path(sys.executable),
                own_is_venv=True, exists=os.path.exists, listdir=os.listdir)
    args.update(kw)
    return plan_install(**args)


def test_a_file_where_a_folder_belongs_is_named(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("not a wheel\n")
    with pytest.raises(LauncherError, match="--wheel .*notes.txt is neither a .whl file nor a folder of wheels"):
        _linux_plan(tmp_path, wheel=notes)
    with pytest.raises(LauncherError, match="--venv .*notes.txt is a file, not a folder for a venv"):
        _linux_plan(tmp_path, venv=notes)


def test_credentials_in_an_index_url_are_not_printed(tmp_path):
    url = "https://__token__:glpat-SECRET123@gitlab.example.com/api/simple"
    plan = _linux_plan(tmp_path, pip_args=[f"--extra-index-url={url}"])
    shown = "\n".join(plan.lines())
    assert "glpat-SECRET123" not in shown and "__token__" not in shown
    assert "--extra-index-url=https://***@gitlab.example.com/api/simple" in shown
    assert f"--extra-index-url={url}" in plan.pip  # pip itself still gets them


def test_a_cut_short_venv_is_removed_and_a_venv_without_pip_is_named(tmp_path, monkeypatch):
    """An interrupted `python -m venv` leaves a python and no pip, which every later install would
    take for a venv. The launcher removes what it made; one already left says what to do."""
    import subprocess
    import sys

    from launcher import vllm_install

    plan = _linux_plan(tmp_path)
    assert plan.create_venv == tmp_path / "venv"

    def cut_short(argv, what):  # a real partial venv (no pip), then the user's Ctrl-C
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(plan.create_venv)], check=True)
        raise KeyboardInterrupt

    monkeypatch.setattr(vllm_install, "_run", cut_short)
    with pytest.raises(KeyboardInterrupt):
        vllm_install.run(plan, echo=lambda _: None)
    assert not plan.create_venv.exists()
    monkeypatch.undo()
    # one left by an earlier launcher (or a kill): pip is checked before it is run, with the way out
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(plan.create_venv)], check=True)
    again = _linux_plan(tmp_path)
    assert again.create_venv is None
    with pytest.raises(LauncherError, match="has no pip") as info:
        vllm_install._has_pip(again.python)
    assert "ensurepip" in info.value.hint


def test_the_steps_are_numbered_from_one_whether_or_not_a_venv_is_made(tmp_path):
    import sys
    from pathlib import Path

    new = [line for line in _linux_plan(tmp_path).lines() if line.startswith("step")]
    assert [line.split()[1] for line in new] == ["1", "2", "3", "4"] and " -m venv " in new[0]
    assert new[0].index(sys.executable) == new[1].index("/") == len("step 1        ")  # one column
    own = [line for line in _linux_plan(tmp_path, venv=None, own_python=Path(sys.executable)).lines()
           if line.startswith("step")]
    assert [line.split()[1] for line in own] == ["1", "2", "3"] and " pip install " in own[0]


def test_a_sigterm_to_the_launcher_ends_the_pip_it_runs(tmp_path):
    """SIGTERM to the launcher alone (systemd, a supervisor) used to end it and leave its child
    running on. A real child here: it is ended, and the error carries 128+15."""
    import os
    import signal
    import sys
    import threading
    import time

    from launcher import vllm_install

    started, pid_file = tmp_path / "started", tmp_path / "pid"
    child = [sys.executable, "-c", f"import os, pathlib, time; pathlib.Path({str(pid_file)!r}).write_text(str(os.getpid())); "
             f"pathlib.Path({str(started)!r}).touch(); time.sleep(60)"]

    def send_once_started():
        for _ in range(200):
            if started.exists():
                os.kill(os.getpid(), signal.SIGTERM)
                return
            time.sleep(0.05)

    before = signal.getsignal(signal.SIGTERM)
    threading.Thread(target=send_once_started, daemon=True).start()
    with pytest.raises(LauncherError, match="stopped by SIGTERM") as info:
        vllm_install._run(child, "pip install")
    assert info.value.exit_code == 128 + signal.SIGTERM
    pid = int(pid_file.read_text())
    for _ in range(100):  # reaped by _run: gone from the process table
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"pip's stand-in {pid} outlived the launcher")
    assert signal.getsignal(signal.SIGTERM) == before  # the handler was put back


def test_after_ctrl_c_pip_is_given_its_grace_before_anything_is_sent():
    """Ctrl-C reaches pip too: it is let finish first, and killed only past the grace."""
    import subprocess
    import sys

    from launcher import vllm_install

    finishing = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    vllm_install._end(finishing, grace_s=5, ask=False)
    assert finishing.returncode == 0  # it ended by itself: nothing was sent
    stuck = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    vllm_install._end(stuck, grace_s=0.3, ask=False)
    assert stuck.returncode == -9  # past the grace: killed


def test_a_vllm_python_that_is_a_folder_is_refused_in_the_dry_run_too(tmp_path):
    """The dry run printed its steps for a folder; the install then failed on "Permission denied"."""
    from typer.testing import CliRunner

    from launcher.cli import app

    res = CliRunner().invoke(app, ["install", "--dry-run", "--vllm-python", str(tmp_path)])
    assert res.exit_code == 2 and f"--vllm-python {tmp_path} is a folder, not a Python executable" in res.output
    assert "step 1" not in res.output


def test_a_wheel_for_another_system_or_machine_is_refused_in_the_plan():
    """pip would refuse it only after the venv was made: the plan says so first."""
    linux_x86 = DOWNLOADS / "vllm-0.29.0-cp38-abi3-manylinux_2_31_x86_64.whl"
    linux_arm = DOWNLOADS / "vllm-0.29.0-cp38-abi3-manylinux_2_31_aarch64.whl"
    with pytest.raises(LauncherError, match="is built for win_amd64, not for Linux") as err:
        windows_plan({DOWNLOADS, WHEEL_29}, wheel=WHEEL_29, windows=False, venv=PurePosixPath("/opt/v"))
    assert "built for this system" in err.value.hint
    with pytest.raises(LauncherError, match="built for manylinux_2_31_x86_64, not for Windows"):
        windows_plan({DOWNLOADS, linux_x86}, wheel=linux_x86)
    with pytest.raises(LauncherError, match="not for this aarch64 machine"):  # a DGX Spark given the x86 wheel
        windows_plan({DOWNLOADS, linux_x86}, wheel=linux_x86, windows=False, venv=PurePosixPath("/opt/v"),
                     machine="aarch64")
    spark = windows_plan({DOWNLOADS, linux_arm}, wheel=linux_arm, windows=False, venv=PurePosixPath("/opt/v"),
                         machine="aarch64")
    assert spark.version == "0.29.0"
    assert windows_plan({DOWNLOADS, WHEEL_29}, wheel=WHEEL_29, machine="AMD64").version == "0.29.0"


def test_a_folder_chooses_among_the_wheels_that_install_here():
    linux = DOWNLOADS / "vllm-0.26.0-cp38-abi3-manylinux_2_31_x86_64.whl"
    # the newest wheel there is for Linux: on Windows the choice is the newest Windows one
    plan = windows_plan({DOWNLOADS, WHEEL_26, linux.with_name("vllm-0.29.0-cp38-abi3-manylinux_2_31_x86_64.whl")},
                        wheel=DOWNLOADS, offline=True)
    assert plan.version == "0.26.0"
    with pytest.raises(LauncherError, match="none of its vLLM wheels installs here .*not for Windows"):
        windows_plan({DOWNLOADS, linux}, wheel=DOWNLOADS, offline=True)
