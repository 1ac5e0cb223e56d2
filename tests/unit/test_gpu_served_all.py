"""tests/gpu/runs/served_all.py: served-all's jobs planned, started side by side, reported and packed.

The jobs run stand-in commands (a served run needs vLLM and a GPU); ``remote.sh served-all``'s
own checks through the shell are in test_gpu_served.py."""

from __future__ import annotations

import socket
import sys
import tarfile

import pytest

from tests.unit.gpu_scripts import load

sa = load("served_all")
SITES = sa.Sites("/s", "/p", "/s33", "/p33", "/rev")


def free_base(jobs: int = 2) -> str:
    """A port base whose jobs' ports nothing holds now (8000 may be another test's)."""
    for base in range(20000, 30000, 1000):
        if not sa.ports_in_use([sa.Job(i, "a", "x", "", "0.21.0", None, base) for i in range(jobs)]):
            return str(base)
    raise AssertionError("no free port block between 20000 and 30000")


def test_each_job_runs_on_each_version_with_its_port_numerics_gpu_and_sites():
    jobs = sa.plan("gemma4-moe-dflash:bench:exact gemma4-moe-dflash-text:dflash,reference",
                   "0.21.0 0.33.0-without-some-patch", ["0", "1", "2"])
    assert [(j.recipe, j.version, j.gpu) for j in jobs] == [
        ("gemma4-moe-dflash", "0.21.0", "0"), ("gemma4-moe-dflash", "0.33.0-without-some-patch", "1"),
        ("gemma4-moe-dflash-text", "0.21.0", "2"), ("gemma4-moe-dflash-text", "0.33.0-without-some-patch", "0")]
    assert jobs[0].env(SITES) == {"SERVED_RECIPE": "gemma4-moe-dflash", "SERVED_PHASES": "bench",
                                  "SERVED_PORT_BASE": "8000", "SERVED_EXACT": "1", "CUDA_VISIBLE_DEVICES": "0"}
    # no numerics given: served.py's own default (SERVED_EXACT unset); a reverted tree names its patch
    assert "SERVED_EXACT" not in jobs[3].env(SITES) and jobs[3].env(SITES)["SERVED_VARIANT"] == "without some-patch"
    assert jobs[3].argv(["cmd"], SITES) == ["cmd", "/s33", "/rev/0.33.0/some-patch", "served-0.33.0-without-some-patch"]
    assert jobs[2].log_name == "served-all-2-0.21.0-dflash-text-dflash+reference.log"
    assert [j.gpu for j in sa.plan("a:x", "0.21.0 0.33.0", [])] == [None, None]


@pytest.mark.parametrize("jobs, versions, gpus, why", [
    ("a:x b:y a:z", "0.21.0", [], "names a recipe twice"),
    ("a:speed", "0.21.0 0.33.0", [], "the speed phase runs alone"),
    ("a:bench,speed b:x", "0.21.0", ["0"], "the speed phase runs alone"),
    ("a:x:fast", "0.21.0", [], "exact or default"),
    ("a", "0.21.0", [], "RECIPE:PHASES"),
    ("", "0.21.0", [], "RECIPE:PHASES"),
])
def test_jobs_that_would_collide_or_share_a_speed_measurement_are_refused(jobs, versions, gpus, why, capsys):
    with pytest.raises(sa.PlanError, match=why):
        sa.plan(jobs, versions, gpus)
    assert sa.main(["check", "--jobs", jobs, "--versions", versions, "--gpus", ",".join(gpus)]) == 2
    assert why in capsys.readouterr().err
    assert len(sa.plan("a:speed", "0.21.0 0.33.0", ["0", "1"])) == 2  # a GPU each: allowed


def test_the_conformance_phase_does_not_start_before_z_labs_record_exists(tmp_path, capsys):
    """It reads the record once, at its start: started without it, its prefix runs are silently
    absent and the pooled prefix acceptance cannot be judged (a run that lost them so)."""
    jobs = "gemma4-moe-dflash:conformance-twin,conformance:exact"
    zlab = tmp_path / "zlab-reference.json"
    assert sa.main(["check", "--jobs", jobs, "--zlab", str(zlab)]) == 2
    err = capsys.readouterr().err
    assert str(zlab) in err and "remote.sh zlab-reference" in err
    assert sa.main(["check", "--jobs", jobs]) == 2 and "none given" in capsys.readouterr().err
    zlab.write_text("{}")
    assert sa.main(["check", "--jobs", jobs, "--zlab", str(zlab), "--port-base", free_base()]) == 0
    # the twin alone stops nothing at a prefix: it starts without the record
    assert sa.main(["check", "--jobs", "gemma4-moe-dflash:conformance-twin:exact", "--port-base", free_base()]) == 0


def test_ports_another_process_holds_are_refused_before_any_job_starts(capsys):
    """Two served-all side by side on one host, both from 8000: the second's servers could not
    bind, and its readiness probes could find the first's (a speed run lost so). Job 1's block
    starts 100 above the base; a port held inside it is named, and another base is accepted."""
    base = int(free_base())
    with socket.socket() as held:
        held.bind(("127.0.0.1", base + 100 + 3))
        held.listen()
        assert sa.main(["check", "--jobs", "a:speed", "--versions", "0.21.0 0.33.0", "--gpus", "0,1",
                        "--port-base", str(base)]) == 2
        err = capsys.readouterr().err
        assert f"ports {base + 103} are in use" in err and "SERVED_ALL_PORT_BASE" in err
        assert sa.main(["check", "--jobs", "a:speed", "--versions", "0.21.0 0.33.0", "--gpus", "0,1",
                        "--port-base", free_base()]) == 0
    assert sa.plan("a:x", "0.21.0 0.33.0", [], 9000)[1].env(SITES)["SERVED_PORT_BASE"] == "9100"


def test_the_jobs_run_side_by_side_and_a_failed_one_fails_the_call(tmp_path, capsys, monkeypatch):
    # Each stand-in job writes its arguments and port, sleeps, and the third fails: all three run
    # at once (the first still runs when the last starts), every log's tail is printed, and the
    # logs come back in one archive.
    job = tmp_path / "job.py"
    job.write_text("import os, sys, time\n"
                   "print('args', *sys.argv[1:], os.environ['SERVED_PORT_BASE'], flush=True)\n"
                   "open(os.environ['MARKS'], 'a').write(f\"start {os.environ['SERVED_PORT_BASE']} {time.time()}\\n\")\n"
                   "time.sleep(0.5)\n"
                   "open(os.environ['MARKS'], 'a').write(f\"end {os.environ['SERVED_PORT_BASE']} {time.time()}\\n\")\n"
                   "sys.exit(3 if os.environ['SERVED_PORT_BASE'] == '8200' else 0)\n")
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    monkeypatch.setenv("MARKS", str(tmp_path / "marks"))  # the jobs' environment is the caller's and theirs
    rc = sa.run(sa.plan("a:x b:y", "0.21.0 0.33.0", [])[:3], [sys.executable, str(job)], SITES, work, out, 0.05)
    assert rc == 1
    marks = [line.split() for line in (tmp_path / "marks").read_text().splitlines()]
    starts = [float(t) for kind, _, t in marks if kind == "start"]
    ends = [float(t) for kind, _, t in marks if kind == "end"]
    assert len(starts) == 3 and max(starts) < min(ends)  # side by side
    printed = capsys.readouterr().out
    assert "args /s /p served 8000" in printed and "args /s33 /p33 served-v33 8100" in printed
    assert "== GPU memory used, every 30 s:" in printed
    with tarfile.open(out / "served-all-logs.tar.gz") as tar:
        assert sorted(tar.getnames()) == sorted([j.log_name for j in sa.plan("a:x b:y", "0.21.0 0.33.0", [])[:3]]
                                                + ["served-all-memory.log"])
    ok = sa.run(sa.plan("a:x", "0.21.0", []), [sys.executable, "-c", "pass"], SITES, work, out, 0)
    assert ok == 0


def test_out_past_eight_files_keeps_the_record_and_its_page_apart(tmp_path):
    out = tmp_path / "out"
    (out / "served-raw").mkdir(parents=True)
    for name in ("a.json", "b.json", "c.log"):
        (out / "served-raw" / name).write_text("x")
    (out / "served.json").write_text("r")
    (out / "served.md").write_text("m")
    (out / "served-bench.json").write_text("b")
    assert sa.pack_out(out) is False and (out / "served-raw").is_dir()  # 6 files: nothing to do
    for i in range(3):
        (out / f"extra-{i}.log").write_text("e")
    assert sa.pack_out(out) is True
    assert sorted(p.name for p in out.iterdir()) == ["served-out.tar.gz", "served.json", "served.md"]
    with tarfile.open(out / "served-out.tar.gz") as tar:
        names = set(tar.getnames())
    assert {"served-raw/a.json", "served-raw/c.log", "served-bench.json", "extra-2.log"} <= names
    assert "served.json" not in names
    # the next command of the same $OUT packs beside it, never over it
    for i in range(9):
        (out / f"later-{i}.log").write_text("l")
    assert sa.pack_out(out) is True
    assert sorted(p.name for p in out.iterdir()) == ["served-out-2.tar.gz", "served-out.tar.gz", "served.json", "served.md"]
    with tarfile.open(out / "served-out.tar.gz") as tar:
        assert "extra-2.log" in tar.getnames()
    with tarfile.open(out / "served-out-2.tar.gz") as tar:
        assert sorted(tar.getnames()) == [f"later-{i}.log" for i in range(9)]


def test_a_port_left_in_time_wait_is_free_as_vllm_binds_it():
    """A readiness probe's connection, closed by the server first, leaves the server's port in
    TIME_WAIT for a minute: a plain bind fails there, vLLM's (SO_REUSEADDR) does not, and a run
    started just after another must not be refused for it."""
    base = int(free_base(1))
    port = base + 2
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen()
        probe = socket.create_connection(("127.0.0.1", port))
        conn, _ = listener.accept()
        conn.close()  # the server side closes first: its end goes to TIME_WAIT
        probe.close()
    with socket.socket() as plain:
        with pytest.raises(OSError):
            plain.bind(("127.0.0.1", port))  # the trap: without SO_REUSEADDR the port looks held
    assert sa.ports_in_use(sa.plan("a:speed", "0.21.0", [], base)) == []


@pytest.mark.parametrize("base", [80, 65530])
def test_a_port_base_outside_the_usable_range_is_refused(base, capsys):
    with pytest.raises(sa.PlanError, match="must lie within 1024-65535"):
        sa.plan("a:x", "0.21.0", [], base)
    assert sa.main(["check", "--jobs", "a:x", "--versions", "0.21.0", "--port-base", str(base)]) == 2
    assert f"SERVED_ALL_PORT_BASE {base}" in capsys.readouterr().err


def test_the_ports_checked_cover_every_phase_port_served_py_uses():
    served = load("served")
    assert max(served.PORT_OFFSETS.values()) < sa.PHASE_PORTS <= sa.PORT_STEP
