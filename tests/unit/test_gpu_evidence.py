"""tests/gpu/reports/evidence.py: the step lists behind `make gpu-evidence`, the split for a GPU host
without network, and the CPU replay of every page from the committed raw records."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.gpu_scripts import GPU_DIR, load

ev = load("evidence")
RESULTS = GPU_DIR / "results"
REPO = GPU_DIR.parents[1]


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    out, work = tmp_path_factory.mktemp("results"), tmp_path_factory.mktemp("work")
    ran = ev.replay(list(ev.ORDER), out, work)
    return out, ran


def test_every_page_is_replayed_or_named_with_its_reason(replayed):
    out, _ = replayed
    committed = sorted(p.name for p in RESULTS.glob("*.json"))
    pages = [n for n in committed if not n.startswith(ev.RAW_RECORDS)]
    regenerated = {w for steps in ev.PAGES.values() for s in steps if s.where == "cpu" for w in s.writes} \
        - ev.NOT_REPLAYED.keys()
    unaccounted = [n for n in pages if n not in regenerated and n not in ev.NOT_REPLAYED]
    assert not unaccounted, f"results pages neither replayed nor listed in evidence.NOT_REPLAYED: {unaccounted}"
    # the list names no page that is gone, and no page that replay does make
    assert set(ev.NOT_REPLAYED) <= set(committed)
    assert not set(ev.NOT_REPLAYED) & regenerated
    # every page replay regenerates was written by a step that ran, not copied
    for name in sorted(regenerated & set(committed)):
        assert (out / name).is_file() and not (out / name).is_symlink(), name


def test_every_replayed_page_equals_the_committed_one_byte_for_byte(replayed):
    out, ran = replayed
    assert {"acceptance-report", "rejudge", "fullsize-report"} <= set(ran)
    regenerated = sorted({w for steps in ev.PAGES.values() for s in steps if s.where == "cpu" for w in s.writes}
                         - ev.NOT_REPLAYED.keys())
    compared = [n for n in regenerated if (RESULTS / n).exists()]
    assert "fullsize.json" in compared and "acceptance.json" in compared and "rejudge.json" in compared
    for name in compared:
        assert (out / name).read_bytes() == (RESULTS / name).read_bytes(), name
        md = name.replace(".json", ".md")
        if (RESULTS / md).exists():
            assert (out / md).read_text() == (RESULTS / md).read_text(), md


def test_the_not_replayed_realshape_records_are_those_without_raw_tokens():
    """The reason given for realshape.json holds: some of its records have no raw record at all."""
    summary = json.loads((RESULTS / "rejudge.json").read_text())["summary"]
    assert summary["judged_from_raw_tokens"] < summary["records"]


def test_a_step_that_fails_stops_the_replay(tmp_path, monkeypatch):
    broken = ev.Step("broken", "cpu", ("{py}", "-c", "raise SystemExit(3)"), writes=("acceptance.json",))
    monkeypatch.setitem(ev.PAGES, "x", (broken,))
    with pytest.raises(RuntimeError, match="broken exited 3"):
        ev.replay(["x"], tmp_path / "r", tmp_path / "w")


def test_the_split_runs_the_same_steps_in_the_same_order():
    for page in [*ev.PAGES, *ev.ORDER]:
        whole = ev.sequence([page])
        parts = [s for side in ev.WHERE for s in ev.sequence([page], (side,))]
        assert whole == parts
        assert [s.where for s in whole] == sorted((s.where for s in whole), key=ev.WHERE.index)
    everything = ev.sequence(list(ev.ORDER))
    assert len(everything) == len(set(everything))


def test_rejudge_runs_after_every_merge_and_fullsize_after_acceptance():
    names = [s.name for s in ev.sequence(list(ev.ORDER))]
    merges = [i for i, n in enumerate(names) if n.startswith("merge-")]
    assert merges and max(merges) < names.index("rejudge")
    assert names.index("acceptance-report") < names.index("fullsize-report")


def test_every_gpu_step_is_a_remote_verb_that_exists():
    verbs = set(re.findall(r"^    ([a-z0-9-]+)\)", (GPU_DIR / "remote.sh").read_text(), re.M))
    for steps in ev.PAGES.values():
        for s in steps:
            if s.where == "gpu":
                named = [a for a in " ".join(s.argv).split() if a in verbs]
                assert named, s.name


def test_every_script_a_step_runs_exists():
    for steps in ev.PAGES.values():
        for s in steps:
            for arg in s.argv:
                for path in re.findall(r"tests/gpu/[\w/.-]+\.(?:py|sh)", arg):
                    assert (REPO / path).is_file(), (s.name, path)


def test_each_page_has_a_make_target_that_runs_it():
    makefile = (REPO / "Makefile").read_text()
    for page in ev.PAGES:
        block = re.search(rf"^gpu-{page}:.*\n\t(.+)$", makefile, re.M)
        assert block and block.group(1).endswith(f" {page}"), page
    assert re.search(r"^gpu-evidence:.*\n\t\$\(EVIDENCE\) all$", makefile, re.M)


def test_the_gpu_side_of_an_air_gapped_pair_makes_no_venv_and_runs_on_the_hosts_python(tmp_path):
    """WHERE without network: no venv (its pip needs the network), remote.sh's evidence verb runs
    evidence.py on the host's Python with the bundles' unidiff folder on PYTHONPATH. (A stand-in
    Python notes what it was given: the real steps need a GPU.)"""
    def dry(*args):  # as a user's shell runs make, also under `make test` (no parent make's flags)
        env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
        return subprocess.run(["make", "--no-print-directory", "-n", "-B", *args], cwd=REPO, env=env,
                              capture_output=True, text=True, check=True).stdout

    offline = dry("gpu-acceptance", "WHERE=gpu,cpu")
    assert offline.strip().splitlines() == ["bash tests/gpu/remote.sh evidence --where gpu,cpu acceptance"]
    for online in (dry("gpu-acceptance"), dry("gpu-acceptance", "WHERE=network")):
        assert "-m venv" in online and "tests/gpu/reports/evidence.py run" in online
    py = tmp_path / "py"
    py.write_text('#!/bin/bash\necho "ARGS $*"\necho "PYTHONPATH $PYTHONPATH"\n')
    py.chmod(0o755)
    env = dict(os.environ, PY=str(py), WORK=str(tmp_path / "work"), PYTHONPATH="/elsewhere")
    done = subprocess.run(["bash", "tests/gpu/remote.sh", "evidence", "--where", "gpu,cpu", "acceptance"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "ARGS tests/gpu/reports/evidence.py run --where gpu,cpu acceptance" in done.stdout
    assert f"PYTHONPATH {tmp_path / 'work'}/host-deps:/elsewhere" in done.stdout


def test_plan_prints_the_side_of_each_step_and_refuses_an_unknown_side():
    proc = subprocess.run([sys.executable, str(GPU_DIR / "reports" / "evidence.py"), "plan", "fullsize", "--where", "network"],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0
    assert proc.stdout and all(line.startswith("network ") for line in proc.stdout.splitlines())
    proc = subprocess.run([sys.executable, str(GPU_DIR / "reports" / "evidence.py"), "plan", "fullsize", "--where", "gpux"],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2 and "gpux" in proc.stderr


def test_merge_served_replaces_the_same_server_and_keeps_the_others(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    row = {"vllm": "0.21.0", "recipe": "gemma4-moe-dflash", "server": "speed", "target_sha256": "t"}
    (results / "served.json").write_text(json.dumps({"meta": {"date": "old"}, "servers": [
        {**row, "server": "reference"}, {**row, "measured": 1}]}))
    src = tmp_path / "served.json"
    src.write_text(json.dumps({"meta": {"date": "new"}, "servers": [{**row, "measured": 2}]}))
    ev.merge_served(src, results)
    doc = json.loads((results / "served.json").read_text())
    assert [(r["server"], r.get("measured")) for r in doc["servers"]] == [("reference", None), ("speed", 2)]
    assert doc["meta"] == {"date": "new"} and (results / "served.md").read_text().startswith("#")


def test_merge_served_puts_no_server_that_did_not_start_over_one_that_did(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    row = {"vllm": "0.33.0", "recipe": "gemma4-moe-dflash", "started": True}
    committed = {"meta": {"date": "old"}, "servers": [{**row, "server": "dflash"}, {**row, "server": "stock"}]}
    (results / "served.json").write_text(json.dumps(committed))
    src = tmp_path / "served.json"
    src.write_text(json.dumps({"meta": {"date": "new"}, "servers": [{**row, "server": "dflash", "started": False}]}))
    with pytest.raises(SystemExit, match="did not start where .* has ones that did \\(0.33.0 gemma4-moe-dflash dflash\\)"):
        ev.merge_served(src, results)
    assert json.loads((results / "served.json").read_text()) == committed
    # the stock server's failed start is its finding: merged
    src.write_text(json.dumps({"meta": {"date": "new"}, "servers": [{**row, "server": "stock", "started": False}]}))
    ev.merge_served(src, results)
    assert [r["started"] for r in json.loads((results / "served.json").read_text())["servers"]] == [True, False]


def test_merge_served_brings_the_bench_files_its_rows_name_and_files_the_raw_records(tmp_path):
    """The rows' `launcher bench` files come from $OUT or its packs (never an earlier run's file
    left in results/), and the run's raw phases go under results/served/ where rejudge reads them."""
    import tarfile

    results, work = tmp_path / "results", tmp_path / "work"
    (results / "served").mkdir(parents=True)
    (results / "served-bench-0.21.0.json").write_text('{"run": "earlier"}')
    out = work / "out"
    (work / "served").mkdir(parents=True)
    (work / "served" / "dflash.json").write_text('{"server": "dflash"}')
    out.mkdir()
    (out / "served-bench-0.21.0.json").write_text('{"run": "this"}')
    (out / "kept.json").write_text('{"run": "packed"}')
    with tarfile.open(out / "served-out.tar.gz", "w:gz") as tar:
        tar.add(out / "kept.json", arcname="served-raw/served-bench-0.33.0.json")
    (out / "kept.json").unlink()
    meta = {"date": "2026-12-01 03:21 UTC", "gpu": "NVIDIA H200, 143771 MiB, 580", "target_sha256": "84c26c18ff",
            "drafter_sha256": "8db4e9f4ff"}
    rows = [{"vllm": v, "recipe": "gemma4-moe-dflash", "server": "dflash", "bench": f"tests/gpu/results/served-bench-{v}.json"}
            for v in ("0.21.0", "0.33.0")]
    (out / "served.json").write_text(json.dumps({"meta": meta, "servers": rows}))
    ev.merge_served(out / "served.json", results, work)
    assert json.loads((results / "served-bench-0.21.0.json").read_text()) == {"run": "this"}
    assert json.loads((results / "served-bench-0.33.0.json").read_text()) == {"run": "packed"}
    [raw] = (results / "served").glob("*.tar.xz")
    assert raw.name == "served-raw-2026-12-01-h200-84c26c18-8db4e9f4.tar.xz"
    with tarfile.open(raw) as tar:
        assert "served/dflash.json" in tar.getnames()
    ev.merge_served(out / "served.json", results, work)  # the same day's second run: beside the first
    assert {p.name for p in (results / "served").glob("*.tar.xz")} == {
        raw.name, "served-raw-2026-12-01-h200-84c26c18-8db4e9f4-2.tar.xz"}
    rows.append({**rows[0], "recipe": "gemma4-moe-dflash-text", "bench": "tests/gpu/results/served-bench-none.json"})
    (out / "served.json").write_text(json.dumps({"meta": meta, "servers": rows}))
    with pytest.raises(SystemExit, match="served-bench-none.json, which a row names, is neither in"):
        ev.merge_served(out / "served.json", results)


def test_the_033_speed_pair_has_time_for_its_drafter_servers_start():
    # On 0.33.0 the drafter server took 337 s and 412 s to become ready, and a served-all at its
    # default 540 s ended before both servers benched 32 requests a level (results/served/): every
    # page's 0.33.0 speed step asks for more
    steps = [s for steps in ev.PAGES.values() for s in steps if s.name in ("served-speed-0.33.0", "served-speed-paired")]
    assert len(steps) >= 2
    for step in steps:
        env = dict(step.env)
        assert int(env["SERVED_DEADLINE_S"]) >= 412 + 2 * 120 + 120, step


def _served_jobs(steps) -> list[tuple[str, str, str]]:
    """(recipe:phases[:numerics], version) of every served job the steps start, as
    remote.sh's served-all reads SERVED_JOBS and SERVED_VERSIONS (its defaults from remote.sh)."""
    text = (GPU_DIR / "remote.sh").read_text()
    default_jobs = re.search(r"local jobs=\$\{SERVED_JOBS:-gemma4-moe-dflash:\$\{SERVED_PHASES:-([\w,]+)\}\}", text)
    default_versions = re.search(r"local versions=\$\{SERVED_VERSIONS:-([\d. ]+)\}", text)
    assert default_jobs and default_versions
    jobs = []
    for step in steps:
        if step.argv[-1] != "served-all":
            continue
        env = dict(step.env)
        for spec in env.get("SERVED_JOBS", f"gemma4-moe-dflash:{default_jobs.group(1)}").split():
            for version in env.get("SERVED_VERSIONS", default_versions.group(1)).split():
                jobs.append((spec, version))
    return sorted(jobs)


def test_a_host_of_one_gpu_and_one_of_two_serve_the_same_jobs():
    """The served runs' two forms (ev.ONE_GPU, ev.GPUS_2) start the same jobs of the same
    releases, each once, on the served page and the speed rows' command; the paired form of the
    speed pair in one served-all command for two, a GPU per job."""
    for page in ("served", "speed"):
        steps = ev.sequence([page], ("gpu",))
        one = [s for s in steps if s.runs_on(1)]
        two = [s for s in steps if s.runs_on(2)]
        assert _served_jobs(one) == _served_jobs(two), page
        assert len(set(_served_jobs(one))) == len(_served_jobs(one))
        assert [s for s in one if s.argv[-1] != "served-all"] == [s for s in two if s.argv[-1] != "served-all"]
        paired = [s for s in two if s.argv[-1] == "served-all"]
        assert all(dict(s.env).get("SERVED_GPUS") == "0,1" for s in paired)
        assert len(paired) <= len([s for s in one if s.argv[-1] == "served-all"])
    served = _served_jobs(ev.sequence(["served"], ("gpu",)))
    # the page's rows are exact numerics; the speed rows are the numerics users run
    assert ("gemma4-moe-dflash-text:reference,dflash,bench:exact", "0.33.0") in served
    assert ("gemma4-moe-dflash:reference,dflash,stock,bench:exact", "0.21.0") in served
    assert not [job for job in served if ":speed" in job[0]]
    assert ("gemma4-moe-dflash:speed:default", "0.21.0") in _served_jobs(ev.sequence(["speed"], ("gpu",)))


def test_the_acceptance_page_reads_the_served_pages_speed_pair_and_serves_none():
    """Its speed columns come from served.json: regenerating it starts no served-all (no speed
    comparison run again), and run with the served page it reads the rows that page merged."""
    steps = ev.PAGES["acceptance"]
    assert not [s.name for s in steps if s.where == "gpu" and "served-all" in s.argv]
    assert "{results}/served.json" in next(s for s in steps if s.name == "acceptance-report").argv
    names = [s.name for s in ev.sequence(["served", "acceptance"])]
    assert names.index("merge-served") < names.index("acceptance-report")


def test_the_served_all_plans_of_both_forms_pass_served_alls_own_check():
    import served_all

    for step in ev.sequence(["served", "speed", "acceptance"], ("gpu",)):
        if step.argv[-1] != "served-all":
            continue
        env = dict(step.env)
        argv = ["--jobs", env.get("SERVED_JOBS", "gemma4-moe-dflash:reference,dflash,stock"),
                "--versions", env.get("SERVED_VERSIONS", "0.21.0 0.33.0"), "--gpus", env.get("SERVED_GPUS", ""), "check"]
        assert served_all.main(argv) == 0, step.name
    # a speed job beside another on one GPU is what served_all refuses: the one-GPU form keeps them apart
    assert served_all.main(["--jobs", "gemma4-moe-dflash:speed:default", "--versions", "0.21.0 0.33.0",
                            "--gpus", "", "check"]) != 0


def test_run_takes_the_form_of_the_hosts_gpu_count(tmp_path, monkeypatch):
    marks = tmp_path / "marks"

    def mark(name, gpus):
        return ev.Step(name, "cpu", ("{py}", "-c", f"open({str(marks)!r}, 'a').write('{name} ')"), gpus=gpus)

    monkeypatch.setitem(ev.PAGES, "x", (mark("any", (0, 1 << 10)), mark("one", ev.ONE_GPU), mark("two", ev.GPUS_2)))
    for gpus, want in ((0, "any one "), (1, "any one "), (2, "any two "), (8, "any two ")):
        marks.write_text("")
        assert ev.run(["x"], ("cpu",), tmp_path / "r", tmp_path / "w", gpus=gpus) == 0
        assert marks.read_text() == want, gpus
    monkeypatch.setenv("EVIDENCE_GPUS", "2")
    assert ev.gpu_count() == 2
    monkeypatch.delenv("EVIDENCE_GPUS")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert ev.gpu_count() == 1  # a host of two limited to one: the one-GPU form
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert ev.gpu_count() == 2
