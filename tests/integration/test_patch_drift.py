"""The drift watch (``launcher patch drift``) and the unsupported-release
answers, on the real released vLLM files from PyPI (cached).

A release without a series of its own is made here by leaving its series
out of a copy of the patches folder: the check then runs the nearest
release's real series against the real release, which is exactly what the
scheduled job does when PyPI or NGC ships a release the project has no
series for yet.
"""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from launcher.cli import app
from launcher.errors import LauncherError
from launcher.patching import drift, engine
from launcher.paths import patches_dir
from tests.integration.patch_trees import mini_tree, snapshot

pytestmark = pytest.mark.network


def _patches_without(tmp_path, *left_out: str):
    root = tmp_path / "patches"
    for series in (patches_dir() / "vllm").iterdir():
        if series.is_dir() and series.name not in left_out:
            shutil.copytree(series, root / "vllm" / series.name)
    return root


def _by_patch(check: drift.ReleaseCheck) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for row in check.rows:
        out.setdefault(row.patch_id, set()).add(row.result)
    return out


def test_a_release_with_its_own_series_is_ok():
    check = drift.check_release("0.29.0", ["asked for"])
    assert (check.series, check.own_series, check.verdict) == ("0.29.0", True, "ok")
    assert {r.layout for r in check.rows} == {"site-packages", "source"}


def test_a_release_without_a_series_is_checked_against_the_nearest(tmp_path):
    # 0.26.0 with only the 0.21.0 series to compare: each patch applies or conflicts
    # (the Triton fix, which 0.26.0 still lacks, applies; the rest was rewritten upstream).
    root = _patches_without(tmp_path, "0.26.0", "0.27.1", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0")
    check = drift.check_release("0.26.0", ["NGC test"], patches_root=root)
    assert (check.series, check.own_series, check.verdict) == ("0.21.0", False, "no series")
    results = _by_patch(check)
    assert results["triton-unified-attention-fully-masked-tile"] == {"applies"}
    assert results["dflash-drafter-own-mm-prefix-config"] == {"conflicts"}
    assert results["cmake-keep-sm121"] == {"applies"}
    conflict = next(r for r in check.rows if r.result == "conflicts")
    assert "hunk" in conflict.detail


def test_nearest_series_of_a_newer_release_reports_the_port_needed(tmp_path):
    root = _patches_without(tmp_path, "0.29.0", "0.30.0", "0.31.0")
    check = drift.check_release("0.29.0", ["PyPI newest"], patches_root=root)
    assert check.series == "0.27.1"  # two minor releases away; 0.33.0 is four
    assert _by_patch(check)["gemma4-dflash-embed-scale-logit-softcap"] == {"conflicts"}
    assert _by_patch(check)["dflash-drafter-own-mm-prefix-config"] == {"conflicts"}
    assert _by_patch(check)["cmake-keep-sm121"] == {"applies"}


@pytest.mark.parametrize("text", [
    '{"name": "nvidia/vllm", "tags": ["25.09-py3", "26.09-py3", "26.08-py3", "26.10-py3", "26.09-py3-igpu"]}',
    '["26.08-py3", "26.10-py3", "26.09-py3", "latest"]',
    "26.09-py3\n26.10-py3\n\n26.08-py3\n",
])
def test_ngc_tag_lists_in_every_form(text):
    assert drift.parse_ngc_tags(text)[-3:] == ["26.08-py3", "26.09-py3", "26.10-py3"]


def test_ngc_tags_map_to_releases_and_new_tags_are_flagged():
    tags = drift.map_ngc_tags(["25.09-py3", "26.08-py3", "26.09-py3", "26.10-py3", "26.11-py3"])
    assert [(t.tag, t.vllm) for t in tags] == [("26.08-py3", "0.27.1"), ("26.09-py3", "0.29.0"),
                                               ("26.10-py3", "0.31.0"), ("26.11-py3", None)]
    assert "NGC_VLLM" in tags[-1].note


@pytest.mark.parametrize("text", ['{"tags": "26.09-py3"}', "{not json"])
def test_a_malformed_ngc_tag_list_is_refused(text):
    with pytest.raises(LauncherError, match="NGC tag list"):
        drift.parse_ngc_tags(text)


def test_watch_checks_each_release_once_and_flags_what_needs_attention(tmp_path):
    report = drift.watch(["0.29.0"], newest="0.33.0", ngc_tags=["26.08-py3", "26.09-py3"])
    assert [(r.version, r.sources) for r in report.releases] == [
        ("0.27.1", ["NGC 26.08-py3"]), ("0.29.0", ["NGC 26.09-py3", "asked for"]), ("0.33.0", ["PyPI newest"])]
    assert not report.needs_attention
    flagged = drift.watch([], newest="0.33.0", ngc_tags=["26.09-py3", "26.11-py3"])
    assert flagged.needs_attention
    missing = drift.watch([], newest="0.29.0", patches_root=_patches_without(tmp_path, "0.29.0"))
    assert missing.needs_attention and missing.releases[0].verdict == "no series"


def test_cli_drift_json_and_exit_code(tmp_path):
    tags = tmp_path / "tags.json"
    tags.write_text('{"tags": ["26.08-py3", "26.09-py3"]}')
    result = CliRunner().invoke(app, ["patch", "drift", "--no-newest", "--ngc-tags", str(tags), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert [r["version"] for r in data["releases"]] == ["0.27.1", "0.29.0"]
    assert {r["verdict"] for r in data["releases"]} == {"ok"}
    tags.write_text("26.11-py3\n")
    text = CliRunner().invoke(app, ["patch", "drift", "--no-newest", "--release", "0.27.1", "--ngc-tags", str(tags)])
    assert text.exit_code == 1
    assert "26.11-py3: vLLM version unknown" in text.output and "needs attention" in text.output


def test_cli_drift_refuses_a_missing_tag_file(tmp_path):
    result = CliRunner().invoke(app, ["patch", "drift", "--no-newest", "--ngc-tags", str(tmp_path / "none.json")])
    assert result.exit_code == 2 and "cannot read the NGC tag list" in result.output


def test_newest_release_on_pypi_is_a_final_release_at_least_0_33_0():
    from packaging.version import Version

    from launcher import pypi

    newest = Version(pypi.latest_release("vllm"))
    assert newest >= Version("0.33.0") and not newest.is_prerelease


# ------------------------------------------------ unsupported releases: patch apply / check


@pytest.mark.parametrize("layout", ["site-packages", "source"])
def test_patch_apply_on_an_unsupported_release_names_the_nearest_and_changes_nothing(layout, tmp_path):
    root = _patches_without(tmp_path, "0.29.0", "0.30.0", "0.31.0")
    tree = mini_tree("0.29.0", layout, tmp_path / "tree", ["vllm/v1/spec_decode/dflash.py"])
    before = snapshot(tree)
    with pytest.raises(LauncherError) as err:
        engine.apply(tree, patches_root=root)
    assert "no patch series for vLLM 0.29.0, so it is not supported" in err.value.message
    assert "the nearest supported release is 0.27.1" in err.value.message
    assert "pip install vllm==0.27.1" in err.value.hint and "--series 0.27.1" in err.value.hint
    assert snapshot(tree) == before


def test_patch_check_against_with_another_series(tmp_path):
    result = CliRunner().invoke(app, ["patch", "check", "--against", "vllm==0.29.0", "--series", "0.27.1"])
    assert result.exit_code == 1  # 0003 does not fit 0.29.0's text: it had to be ported
    assert "series 0.27.1" in result.output and "gemma4-dflash-embed-scale-logit-softcap" in result.output
    alone = CliRunner().invoke(app, ["patch", "check", "--series", "0.27.1"])
    assert alone.exit_code == 2 and "--series needs --against" in alone.output


# ------------------------------------------------ the scheduled job only calls the launcher


def test_workflow_is_scheduled_calls_the_drift_command_and_its_scripts_are_shellcheck_clean(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    import yaml

    workflow = Path(__file__).resolve().parents[2] / ".github" / "workflows" / "drift-watch.yml"
    data = yaml.safe_load(workflow.read_text())
    assert data[True]["schedule"]  # PyYAML reads the key `on` as True
    steps = data["jobs"]["drift"]["steps"]
    scripts = [s["run"] for s in steps if "run" in s]
    assert any("launcher patch drift" in s and "--ngc-tags" in s for s in scripts)
    for i, script in enumerate(scripts):
        path = tmp_path / f"step{i}.sh"
        path.write_text("#!/usr/bin/env bash\n" + script)
        check = subprocess.run([str(Path(sys.executable).parent / "shellcheck"), str(path)],
                               capture_output=True, text=True)
        assert check.returncode == 0, check.stdout
