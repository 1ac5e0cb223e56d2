"""tests/gpu/remote.sh's background training: the call returns while the training runs, also when
its output goes through a pipe (on 2026-11-27 a `train-bg | tail` call held the device until its time
limit). Runs the script's own train_background function with a stand-in repository whose
tests/gpu/remote.sh only sleeps (the real one would install vLLM), and `install` stubbed out."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

REMOTE = Path(__file__).resolve().parents[1] / "gpu" / "remote.sh"


def test_train_bg_returns_through_a_pipe_while_the_training_runs(tmp_path):
    repo, work = tmp_path / "repo", tmp_path / "work"
    (repo / "tests" / "gpu").mkdir(parents=True)
    # The stand-in "training": notes its process group, then sleeps far longer than the call.
    (repo / "tests" / "gpu" / "remote.sh").write_text(f"echo $$ > {work}/bg.pid\nsleep 60\n")
    functions = REMOTE.read_text().split('\ncmd=${1:-}\n')[0]
    script = functions + "\ninstall() { :; }\ntrain_background\n"
    (tmp_path / "remote-functions.sh").write_text(script)
    env = dict(os.environ, WORK=str(work), OUT=str(work / "out"))
    done = subprocess.run(["bash", "-c", f"bash {tmp_path / 'remote-functions.sh'} | tail -1"], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=45)
    try:
        assert done.returncode == 0, done.stderr
        assert "training in the background" in done.stdout
        assert not (work / "train-bg.rc").exists()  # the call returned before the training ended
        for _ in range(100):  # the training did start, in a session of its own
            if (work / "bg.pid").exists() and (work / "bg.pid").read_text().strip():
                break
            time.sleep(0.1)
        pid = int((work / "bg.pid").read_text())
        assert os.getsid(pid) == pid or os.getsid(pid) != os.getsid(0)
    finally:
        if (work / "bg.pid").exists() and (work / "bg.pid").read_text().strip():
            os.killpg(os.getpgid(int((work / "bg.pid").read_text())), signal.SIGKILL)
