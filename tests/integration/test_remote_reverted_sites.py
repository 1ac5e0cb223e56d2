"""tests/gpu/remote.sh's reverted_sites: the trees issue 25's ablation and the trace run without
0014 run on. Runs the script's own function on the released 0.21.0 wheel (from PyPI, cached) with
this checkout's patch engine; only the run names' lookup (realshape.py --reverts-of) and the copy
are real here, nothing is stood in. The device runs the same function on its bundle's site."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.patching.engine import status
from launcher.patching.stamp import STAMP_REL
from tests.unit.gpu_scripts import load
from tests.integration.patch_trees import pristine

ROOT = Path(__file__).resolve().parents[2]
REMOTE = ROOT / "tests" / "gpu" / "remote.sh"
RUN = "trained-dflash-fa2-cg-bf16-smallkv-trace-bi-noinductor-without-dflash-lookahead-slots-at-prefill"
# A 0.33.0 ablation run in the same lanes: its revert is not built from 0.21.0's series.
V33_RUN = "v33-trained-dflash-trained-fa2-cg-bf16-capture-without-gemma4-dflash-embed-scale-logit-softcap"

pytestmark = pytest.mark.network  # the released wheel
realshape = load("realshape")


def test_each_reverted_tree_lacks_only_its_patch_and_carries_its_own_series_hash(tmp_path):
    functions = REMOTE.read_text().split('\ncmd=${1:-}\n')[0]
    script = tmp_path / "remote-functions.sh"
    script.write_text(functions + '\nreverted_sites "$1" 0.21.0 "$SITE"\n')
    env = dict(os.environ, WORK=str(tmp_path / "work"), OUT=str(tmp_path / "out"), PY=sys.executable,
               SITE=str(pristine("0.21.0", "site-packages")), REVERTED_SITES=str(tmp_path / "reverted"),
               MODELS_TRAINED=str(tmp_path / "models"))
    (tmp_path / "work").mkdir()
    done = subprocess.run(["bash", str(script), f"trained-ref-bf16,{RUN};{V33_RUN}"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    site = tmp_path / "reverted" / "0.21.0" / "dflash-lookahead-slots-at-prefill"
    scheduler = (site / "vllm/v1/core/sched/scheduler.py").read_text()
    assert "0 if request.num_computed_tokens == 0 else self.num_lookahead_tokens" in scheduler  # 0014 left out
    assert "num_in_flight_tokens" in scheduler and "self.num_spec_tokens + 1" in scheduler  # 0013, 0015 in
    # The tree's stamp names the series it carries; realshape.py records that hash for the run.
    stamp = json.loads((site / STAMP_REL).read_text())
    assert "dflash-lookahead-slots-at-prefill" not in json.dumps(stamp)
    full = status(str(pristine("0.21.0", "site-packages"))).series_hash  # this checkout's whole series
    assert len(stamp["series_hash"]) == 64 and stamp["series_hash"] != full
    assert realshape.run_tree_hash(f"{site}:/tmp/site") == stamp["series_hash"]
    assert sorted(p.name for p in (tmp_path / "reverted" / "0.21.0").iterdir()) == [
        "dflash-lookahead-slots-at-prefill"]


def test_no_run_named_means_the_default_trained_runs_and_a_missing_tree_is_refused(tmp_path, capsys):
    # remote.sh passes "${RUNS:-};${RS_PARALLEL:-}": with neither set it runs every trained run of
    # the release, so their reverts must be built too.
    assert realshape.main(["--models", str(tmp_path), "--vllm", "0.21.0", "--reverts-of", ";"]) == 0
    default = set(capsys.readouterr().out.split())
    assert "dflash-lookahead-slots-at-prefill" in default and "dflash-target-layer-ids-offset" in default
    args = type("A", (), {"reverted_sites": str(tmp_path), "site_patched": "/p:/site"})()
    with pytest.raises(SystemExit, match="does not exist"):
        realshape._reverted_site(args, "dflash-lookahead-slots-at-prefill")
    (tmp_path / "dflash-lookahead-slots-at-prefill").mkdir()
    assert realshape._reverted_site(args, "dflash-lookahead-slots-at-prefill") == \
        f"{tmp_path}/dflash-lookahead-slots-at-prefill:/site"


def test_a_patch_id_not_in_the_series_is_refused(tmp_path):
    functions = REMOTE.read_text().split('\ncmd=${1:-}\n')[0]
    script = tmp_path / "remote-functions.sh"
    script.write_text(functions + '\nreverted_sites "$1" 0.21.0 /nonexistent\n')
    # The run-name lookup stood in by a script that names a misspelt id (the lookup is tested above).
    lookup = tmp_path / "py"
    lookup.write_text("#!/bin/sh\necho dflash-lookahead-slots-at-prefil\n")
    lookup.chmod(0o755)
    done = subprocess.run(["bash", str(script), "any"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, WORK=str(tmp_path), PY=str(lookup),
                                   REVERTED_SITES=str(tmp_path / "reverted")))
    assert done.returncode != 0
    assert "dflash-lookahead-slots-at-prefil is not in the 0.21.0 series" in done.stderr
    assert not (tmp_path / "reverted").exists()
