"""tests/gpu/bars.yaml, the criteria every GPU report applies, and its version in each record
(issue 51, item 1): the hash is git's blob hash, reports read their thresholds from the file,
and a record's bars were committed before the record."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml

from tests.unit.gpu_scripts import load as _load

bars = _load("bars")
REPO = Path(__file__).resolve().parents[2]
BARS = REPO / "tests" / "gpu" / "bars.yaml"
RESULTS = REPO / "tests" / "gpu" / "results"


def _git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def test_blob_hash_is_gits():
    assert bars.blob_hash() == _git(REPO, "hash-object", str(BARS)).strip()


def test_the_fallback_parser_reads_the_file_as_yaml_does():
    # a GPU host without PyYAML reads bars.yaml with bars.parse: it must give the same criteria
    assert bars.parse(BARS.read_text()) == yaml.safe_load(BARS.read_text())


def test_reports_read_their_thresholds_from_the_file():
    data = yaml.safe_load(BARS.read_text())
    gate, acc, served = _load("gate"), _load("acceptance_report"), _load("served_report")
    assert (gate.LOOP_WINDOW, gate.LOOP_MAX_PERIOD) == (data["gate"]["loop_window"], data["gate"]["loop_max_period"])
    assert (gate.MIN_PROMPTS, gate.MIN_GENERATED_TOKENS) == (data["gate"]["min_prompts"],
                                                             data["gate"]["min_generated_tokens"])
    assert gate.MAX_LOOPING_FRACTION == data["gate"]["max_looping_fraction"]
    assert acc.MIN_EQUAL_FRACTION == data["equivalence"]["min_equal_fraction"]
    assert acc.MIN_CONTEXTS == data["equivalence"]["min_contexts"]
    assert acc.MIN_ACCEPTANCE == data["acceptance"]["min_mean_acceptance_length"]
    assert acc.MAX_RELATIVE_GAP == data["acceptance"]["max_relative_gap"]
    assert acc.MAX_PROJECTION_GAP == data["speed"]["max_projection_gap"]
    assert served.ACCEPTANCE_BAR == data["acceptance"]["served_min_mean_acceptance_length"]
    # the noise procedure is a percentile of the twin's moves, never their maximum
    assert data["noise"]["margin_move_percentile"] < 100


def _repo(tmp_path):
    repo = tmp_path / "r"
    repo.mkdir()
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "t@t")
    _git(repo, "config", "user.name", "t")
    (repo / "tests" / "gpu" / "results").mkdir(parents=True)
    return repo


def _commit(repo, msg):
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", msg)


def test_a_record_must_name_bars_committed_before_it(tmp_path):
    repo = _repo(tmp_path)
    path = repo / "tests" / "gpu" / "bars.yaml"
    path.write_text("gate: {min_prompts: 32}\n")
    _commit(repo, "bars v1")
    v1 = bars.blob_hash(path)
    results = repo / "tests" / "gpu" / "results" / "r.json"
    rel = "tests/gpu/results/r.json"
    results.write_text(json.dumps([{"name": "a", "bars": v1}]))
    _commit(repo, "record under v1")
    assert bars.provenance(repo, {"bars": v1}, rel) == "bars committed before the record"
    # bars changed in the same commit as a record that names the new version: not before it
    path.write_text("gate: {min_prompts: 16}\n")
    v2 = bars.blob_hash(path)
    results.write_text(json.dumps([{"name": "a", "bars": v1}, {"name": "b", "bars": v2}]))
    _commit(repo, "bars v2 with a record")
    assert bars.provenance(repo, {"bars": v2}, rel) == "bars not committed before the record"
    # a version never committed, and a record without a hash
    assert bars.provenance(repo, {"bars": "0" * 40}, rel) == "bars version never committed"
    assert bars.provenance(repo, {"name": "old"}, rel) == "predates the bars file"


def test_every_committed_record_names_bars_committed_before_it_or_predates_them():
    versions = bars.committed_versions(REPO)
    verdicts, realshape_predates = {}, 0
    files = {"realshape.json": json.loads((RESULTS / "realshape.json").read_text()),
             "served.json": json.loads((RESULTS / "served.json").read_text())["servers"]}
    for name, records in files.items():
        for rec in records:
            verdict = bars.provenance(REPO, rec, f"tests/gpu/results/{name}", versions=versions)
            verdicts.setdefault(verdict, []).append(f"{name}: {rec.get('name') or rec.get('server')}")
            realshape_predates += name == "realshape.json" and verdict == "predates the bars file"
    assert set(verdicts) <= {"bars committed before the record", "predates the bars file"}, \
        {k: v for k, v in verdicts.items() if k not in ("bars committed before the record", "predates the bars file")}
    # the ones without a hash are reported, not accepted silently: the re-judge lists them
    rows = json.loads((RESULTS / "rejudge.json").read_text())["records"]
    assert sum(r["bars"] == "predates the bars file" for r in rows) == realshape_predates
