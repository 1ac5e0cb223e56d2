"""Two `make test` runs on one machine (issue 29.8): what keeps them apart.

A second run started beside the first made 7 docker tests error and 1 fail:
fixed image tags (one run re-pointed a tag the other had just read), a shared
wheel cache written by both at once, a fixed container name. Running two whole
suites at once is not something a test can do here; these tests prove the
parts: tags unique per run, the cache lock serializing two processes, and a
failed build showing its command's output. No daemon is needed: where an image
build is involved, a stand-in client takes the SDK's place (the daemon-backed
tests in test_docker_*.py use the same functions for real).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.integration import docker_env

REPO = docker_env.REPO


def _in_another_run(code: str) -> str:
    """Run ``code`` in a fresh Python, as a second test run would; its stdout."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO,
                          check=True, timeout=120).stdout.strip()


def test_image_tags_are_unique_per_run_and_name_their_content():
    probe = "from tests.integration import docker_env as d; print(d.run_tag('vllm-sm12x-test/fake-vllm', 'abc123def456'))"
    first, second = _in_another_run(probe), _in_another_run(probe)
    assert first != second
    for tag in (first, second, docker_env.run_tag("vllm-sm12x-test/fake-vllm", "abc123def456")):
        assert re.fullmatch(r"vllm-sm12x-test/fake-vllm:abc123def456-run\d+-\d{10}-[0-9a-f]{8}", tag), tag
    assert docker_env.run_tag("r", "k") == docker_env.run_tag("r", "k")  # stable within a run


class _Image:
    def __init__(self, images, tag):
        self.images, self.tags = images, [tag]

    def tag(self, repo, tag):
        self.images.tagged.append(f"{repo}:{tag}")


class _Images:
    """Stand-in for ``DockerClient.images``: records builds, tags and removals."""

    def __init__(self, fail_with_log=None):
        self.built, self.tagged, self.removed, self.fail_with_log = [], [], [], fail_with_log

    def build(self, *, tag, **_):
        import docker

        if self.fail_with_log is not None:
            raise docker.errors.BuildError("The command '/bin/sh -c pip install x' returned a non-zero code: 1",
                                           self.fail_with_log)
        self.built.append(tag)
        return _Image(self, tag), iter(())

    def remove(self, tag, noprune=False):
        self.removed.append((tag, noprune))


class _Containers:
    def list(self, **_):
        return []


class _Client:
    def __init__(self, images):
        self.images, self.containers = images, _Containers()


def test_builds_are_tagged_for_this_run_once_and_removed_at_its_end(monkeypatch):
    monkeypatch.setattr(docker_env, "_RUN_TAGS", [])
    images = _Images()
    files = {"Dockerfile": (b"FROM scratch\n", 0o644)}
    tag = docker_env.build_from_files(_Client(images), "vllm-sm12x-test/x", files)
    assert tag.endswith(f"-{docker_env.RUN_ID}") and tag.startswith("vllm-sm12x-test/x:")
    assert docker_env.build_from_files(_Client(images), "vllm-sm12x-test/x", files) == tag
    assert images.built == [tag]  # built once per run; a second run builds (from docker's cache) its own
    # The content keeps a name of its own: the next run's cache, and no untagged image once the run tag goes.
    content = tag.split(":")[1].split("-run")[0]
    assert images.tagged == [f"vllm-sm12x-test/x:{content}-cache"]
    docker_env.remove_run_tags(_Client(images))
    assert images.removed == [(tag, False)] and docker_env._RUN_TAGS == []


def test_a_failed_build_shows_the_failing_commands_own_output(monkeypatch):
    monkeypatch.setattr(docker_env, "_RUN_TAGS", [])
    log = [{"stream": "Step 3/4 : RUN pip install x\n"}, {"stream": " ---> Running in 1a2b\n"},
           {"stream": "ERROR: No matching distribution found for x==9.9\n"},
           {"error": "The command '/bin/sh -c pip install x' returned a non-zero code: 1"}]
    with pytest.raises(pytest.fail.Exception) as err:
        docker_env.build_from_files(_Client(_Images(fail_with_log=log)), "vllm-sm12x-test/x",
                                    {"Dockerfile": (b"FROM scratch\n", 0o644)})
    text = str(err.value)
    assert "ERROR: No matching distribution found for x==9.9" in text and "Step 3/4 : RUN pip install x" in text
    assert docker_env._RUN_TAGS == []


_WORKER = textwrap.dedent("""
    import json, os, sys, time
    from pathlib import Path
    from tests.integration import docker_env

    root = Path(sys.argv[1])
    log = root / "log"

    def note(what):
        with open(log, "a") as f:
            f.write(json.dumps([what, os.getpid()]) + "\\n")

    (root / f"ready-{os.getpid()}").touch()
    while not (root / "go").exists():  # both start filling at the same moment
        time.sleep(0.01)

    def fill():
        note("fill-start")
        time.sleep(0.5)  # long enough that an unlocked second run would start its own fill
        (root / "entry.complete").write_text("ok")
        note("fill-end")

    docker_env.fill_once(root / "entry.complete", fill)
    with docker_env.cache_lock(root / "other-entry"):
        note("hold-start")
        time.sleep(0.3)
        note("hold-end")
""")


def test_two_runs_fill_a_shared_cache_entry_once_and_hold_its_lock_in_turn(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, str(tmp_path)], env=env, cwd=REPO) for _ in range(2)]
    try:
        while len(list(tmp_path.glob("ready-*"))) < 2 and all(p.poll() is None for p in procs):
            time.sleep(0.01)
        (tmp_path / "go").touch()
        assert [p.wait(timeout=120) for p in procs] == [0, 0]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    events = [json.loads(line) for line in (tmp_path / "log").read_text().splitlines()]
    fills = [e for e in events if e[0].startswith("fill")]
    # One run filled the entry; the other waited on the lock and found it whole.
    assert [e[0] for e in fills] == ["fill-start", "fill-end"] and fills[0][1] == fills[1][1]
    holds = [e for e in events if e[0].startswith("hold")]
    # The lock is held in turn: each start is followed by the same process's end.
    assert [e[0] for e in holds] == ["hold-start", "hold-end"] * 2
    assert holds[0][1] == holds[1][1] and holds[2][1] == holds[3][1] and holds[0][1] != holds[2][1]


def test_the_container_of_the_recipe_based_docker_test_is_named_per_run():
    """test_hf_token_home_and_offline_reach_the_container created a container named
    after the shipped recipe: a run beside it met the name (409 Conflict)."""
    source = (REPO / "tests" / "integration" / "test_docker_runtime.py").read_text(encoding="utf-8")
    body = source.split("def test_hf_token_home_and_offline_reach_the_container", 1)[1].split("\ndef ", 1)[0]
    assert 'plan.recipe = f"test-{uuid.uuid4().hex[:8]}"' in body
    assert body.index("plan.recipe = ") < body.index("created(client, plan, spec)")


def test_engines_sh_takes_a_lock_before_it_starts_dockerd_or_builds_base_images(tmp_path):
    """Two runs of tests/engines.sh at once: the second waits for the first's lock."""
    script = (REPO / "tests" / "engines.sh").read_text(encoding="utf-8")
    functions = script.rsplit('\nmain "$@"', 1)[0]
    main = functions.split("\nmain() {", 1)[1]
    assert main.index("take_lock") < main.index("daemon_answers") < main.index("build_busybox_image")
    lock = tmp_path / "engines.lock"
    log = tmp_path / "log"
    code = functions + f'\ntake_lock; echo "start $1" >> {log}; sleep 0.5; echo "end $1" >> {log}\n'
    procs = [subprocess.Popen(["bash", "-c", code, "engines", str(i)], env=dict(os.environ, ENGINES_LOCK=str(lock)))
             for i in (1, 2)]
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    lines = log.read_text().splitlines()
    first, second = lines[0].split()[1], lines[2].split()[1]
    # One run's start and end, then the other's: never interleaved.
    assert lines == [f"start {first}", f"end {first}", f"start {second}", f"end {second}"] and first != second


def test_the_dockerd_engines_sh_starts_does_not_keep_its_lock(tmp_path):
    """engines.sh takes its lock on fd 9 and then starts dockerd, which outlives it. A
    daemon that inherits fd 9 holds the lock for its whole life, so the next `make test`
    on the machine waited forever (seen here). Run start_dockerd with a stand-in daemon
    (a fake `dockerd` that stays up, a fake `docker` that answers once it is up: no second
    real daemon can run beside the one the suite uses), then check the lock is free while
    the stand-in still runs.

    The stand-in is found by the PID it writes into this test's own folder, never by a
    pattern (another run's stand-in would match it), and it stays up until this test
    tells it to stop, or this test's process is gone: no lifetime to outlast on a slow
    machine."""
    script = (REPO / "tests" / "engines.sh").read_text(encoding="utf-8")
    functions = script.rsplit('\nmain "$@"', 1)[0]
    fake = tmp_path / "bin"
    fake.mkdir()
    up, pidfile, stop = tmp_path / "up", tmp_path / "dockerd.pid", tmp_path / "stop"
    (fake / "dockerd").write_text(
        f"#!/bin/sh\necho $$ > {pidfile}\ntouch {up}\n"
        f"while [ ! -f {stop} ] && kill -0 {os.getpid()} 2>/dev/null; do sleep 0.2; done\n")
    (fake / "docker").write_text(f"#!/bin/sh\n[ -f {up} ]\n")
    for f in fake.iterdir():
        f.chmod(0o755)
    lock = tmp_path / "engines.lock"
    code = functions + "\ntake_lock; start_dockerd; echo started\n"
    env = dict(os.environ, ENGINES_LOCK=str(lock), DOCKERD_LOG=str(tmp_path / "dockerd.log"),
               PATH=f"{fake}:{os.environ['PATH']}")
    res = subprocess.run(["bash", "-c", code], env=env, capture_output=True, text=True, timeout=60)
    pid = int(pidfile.read_text()) if pidfile.is_file() else None
    try:
        assert res.returncode == 0 and "started" in res.stdout, res.stderr
        assert pid is not None and _alive(pid), "the stand-in daemon should still be running"
        free = subprocess.run(["flock", "-n", str(lock), "true"], timeout=10)
        assert free.returncode == 0, "the daemon kept the lock"
    finally:
        stop.touch()
        if pid is not None:
            _end(pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _end(pid: int) -> None:
    """Wait for the stand-in to see its stop file; SIGTERM it (by its PID) if it does not."""
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(pid):
        os.kill(pid, signal.SIGTERM)


def test_no_script_or_test_finds_processes_by_a_pattern():
    """`pgrep -f`, `pkill -f` and `killall` match every checkout's processes on the machine:
    one run found or killed another's (issue 57). Processes are found by their PIDs."""
    pattern = re.compile(r"\b(pgrep|pkill|killall)\b")
    found = []
    for top in ("tests", "docker", "build", "launcher"):
        for path in sorted((REPO / top).rglob("*")):
            if path.suffix in {".py", ".sh", ".ps1"} or path.name in {"Dockerfile", "entrypoint.sh"}:
                if path == Path(__file__):
                    continue
                for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
                    if pattern.search(line) and not line.lstrip().startswith("#"):
                        found.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    found += [f"Makefile: {line.strip()}" for line in (REPO / "Makefile").read_text().splitlines()
              if pattern.search(line) and not line.lstrip().startswith("#")]
    assert found == []


def test_run_ids_in_names_are_read_with_their_start_time():
    """What the sweep of killed runs' images reads off a tag: the run id, its pid and start time
    (the older form had no start time: the sweep then goes by the image's age and the pid)."""
    assert docker_env._run_started(docker_env.run_tag("vllm-sm12x-test/x", "abc")) == (
        docker_env.RUN_ID, os.getpid(), docker_env.RUN_STARTED)
    assert docker_env._run_started("vllm-sm12x-test/x:abc-run5574-98473aab") == ("run5574-98473aab", 5574, None)
    assert docker_env._run_started("vllm-sm12x-test/x:abc-cache") is None
    assert docker_env._run_started("vllm-sm12x-test/busybox:r1") is None
