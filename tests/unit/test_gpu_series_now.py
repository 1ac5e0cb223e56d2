"""series_now.py: the current series hash per release and whether a record is stale (issue 51, item 6)."""

from __future__ import annotations

import shutil
from pathlib import Path

from launcher.patching.series import series_for
from tests.unit.gpu_scripts import load as _load

sn = _load("series_now")
PATCHES = Path(__file__).resolve().parents[2] / "patches"


def test_the_current_hash_is_the_series_hash_of_this_checkout():
    for version in ("0.21.0", "0.33.0"):
        assert sn.current_hash(version) == series_for(version).hash
    assert sn.current_hash("0.0.1") is None


def test_an_ablation_runs_hash_is_the_series_less_that_patch(tmp_path):
    # the tree remote.sh's patches_without builds: the series file without the patch's line
    root = tmp_path / "patches"
    shutil.copytree(PATCHES, root)
    series = root / "vllm" / "0.21.0" / "series"
    pid = "gemma4-dflash-embed-scale-logit-softcap"
    series.write_text("".join(ln for ln in series.read_text().splitlines(keepends=True) if pid not in ln))
    less = series_for("0.21.0", root).hash
    assert less != series_for("0.21.0").hash
    assert sn.current_hash("0.21.0", pid) == less
    record = {"vllm": "0.21.0", "series": less, "revert": pid}
    assert sn.staleness(record) == "current"
    assert sn.staleness(dict(record, revert=None)) == "stale"  # the whole series' run: another hash


def test_staleness_of_records():
    now = series_for("0.33.0").hash
    assert sn.staleness({"vllm": "0.33.0", "series": now}) == "current"
    assert sn.staleness({"vllm": "0.33.0", "series": "8d57190e" + "0" * 56}) == "stale"
    assert sn.staleness({"vllm": "0.33.0", "series": "stock"}) == "stock"
    assert sn.staleness({"vllm": "0.33.0"}) == "unrecorded"
    assert sn.staleness({"series": now}) == "unrecorded"
