"""tests/gpu/reports/evidence.py: the step lists behind `make gpu-evidence`, the split for a GPU host
without network, and the CPU replay of every page from the committed raw records."""

from __future__ import annotations

import json
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


def test_the_033_speed_pair_has_time_for_its_drafter_servers_start():
    # On 0.33.0 the drafter server took 337 s and 412 s to become ready, and a served-all at its
    # default 540 s ended before both servers benched 32 requests a level (results/served/): every
    # page's 0.33.0 speed step asks for more
    steps = [s for steps in ev.PAGES.values() for s in steps if s.name == "served-speed-0.33.0"]
    assert len(steps) >= 2
    for step in steps:
        env = dict(step.env)
        assert int(env["SERVED_DEADLINE_S"]) >= 412 + 2 * 120 + 120, step
