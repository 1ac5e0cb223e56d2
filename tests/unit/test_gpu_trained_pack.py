"""Carrying the trained checkpoints between sessions (tests/gpu/staging/trained_pack.py, remote.sh
pack-trained / receive / extras / check-trained), run for real on CPU with a small stand-in
checkpoint: the real tar, split, manifest, checksum and unpack paths, only the weights are
a few made-up bytes instead of a trained model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.gpu_scripts import load as _load

REPO = Path(__file__).resolve().parents[2]
pack = _load("trained_pack")
tt = _load("train_target")


def _checkpoint(root: Path) -> Path:
    """models-trained/ with a target folder whose train record names its real checkpoint_sha256."""
    target = root / "trained-a4b-r30"
    target.mkdir(parents=True)
    (target / "model.safetensors").write_bytes(os.urandom(50_000))
    (target / "config.json").write_text('{"model_type": "gemma4"}\n')
    (root / "dflash-r5-for-trained").mkdir()
    (root / "dflash-r5-for-trained" / "model.safetensors").write_bytes(os.urandom(7_000))
    (root / "shapes.json").write_text("{}\n")
    record = {"target_sha256": tt.checkpoint_sha256(target), "loss_curve": [{"step": 0, "loss": 9.0}]}
    (target / "train-record.json").write_text(json.dumps(record) + "\n")
    return target


def _remote(cmd: str, tmp: Path, **env) -> subprocess.CompletedProcess:
    base = {"MODELS_TRAINED": str(tmp / "models-trained"), "WORK": str(tmp / "work"),
            "BUNDLE_DIR": str(tmp / "bundle"), "SITE": str(tmp / "site"), "STAGE": str(tmp / "stage"),
            "PY": sys.executable, "PACK_PART_BYTES": "20000"}
    return subprocess.run(["bash", "tests/gpu/remote.sh", cmd], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, **base, **env}, timeout=120)


def test_pack_collect_receive_unpack_round_trip(tmp_path):
    target = _checkpoint(tmp_path / "models-trained")
    want = json.loads((target / "train-record.json").read_text())["target_sha256"]
    outs = [tmp_path / "out0", tmp_path / "out1"]
    for out, parts in zip(outs, ["0 1", "2 3"]):
        out.mkdir()
        res = _remote("pack-trained", tmp_path, OUT=str(out), PACK_PARTS=parts)
        assert res.returncode == 0, res.stderr
    manifest = json.loads((outs[0] / "extras-trained.json").read_text())
    # 57 kB of files, tar's headers and 10 KiB records: 71,680 bytes in 20 kB parts.
    assert manifest["target_sha256"] == want and len(manifest["parts"]) == 4
    stage = tmp_path / "stage"
    assert pack.collect(outs[0], stage) == ["extras-trained.tar.part02", "extras-trained.tar.part03"]
    assert pack.collect(outs[1], stage) == []

    # A fresh machine: nothing under models-trained until the carried parts are unpacked.
    # receive insists on the vLLM bundle's manifest, which this test does not carry: an empty
    # manifest stands in for it.
    (stage / "bundle.json").write_text('{"sha256": "", "bytes": 0, "parts": []}\n')
    fresh = tmp_path / "fresh"
    (tmp_path / "site").mkdir()
    env = {"MODELS_TRAINED": str(fresh / "models-trained"), "OUT": str(tmp_path / "o")}
    assert _remote("receive", tmp_path, **env).returncode == 0
    # The next call's receive leaves a part it already holds alone (a background extras may be
    # reading it: on 2026-11-28 one that was rewritten under it failed the whole sha256).
    held = tmp_path / "bundle" / "extras-trained.tar.part00"
    os.utime(held, ns=(0, 0))
    again = _remote("receive", tmp_path, **env)
    assert again.returncode == 0 and "extras-trained parts held: 4/4" in again.stdout, again.stderr
    assert held.stat().st_mtime_ns == 0  # not written again
    res = _remote("extras", tmp_path, **env)
    assert res.returncode == 0, res.stderr
    res = _remote("check-trained", tmp_path, **env)
    assert res.returncode == 0 and want in res.stdout, res.stderr
    unpacked = fresh / "models-trained" / "trained-a4b-r30" / "model.safetensors"
    assert unpacked.read_bytes() == (target / "model.safetensors").read_bytes()

    # A damaged weight is caught by the identity check, not served.
    data = bytearray(unpacked.read_bytes())
    data[100] ^= 0xFF
    unpacked.write_bytes(bytes(data))
    res = _remote("check-trained", tmp_path, **env)
    assert res.returncode != 0 and "is not its record's" in res.stderr


def test_collect_refuses_a_damaged_part_and_a_second_checkpoints_parts(tmp_path):
    files = tmp_path / "files"
    files.mkdir()
    (files / "extras-trained.tar.part00").write_bytes(b"a" * 100)
    pack.write_manifest(files, {"target_sha256": "t1"})
    (files / "extras-trained.tar.part00").write_bytes(b"b" * 100)  # damaged after the manifest
    with pytest.raises(SystemExit, match="sha256 differs"):
        pack.collect(files, tmp_path / "stage")

    (files / "extras-trained.tar.part00").write_bytes(b"a" * 100)
    assert pack.collect(files, tmp_path / "stage") == []
    other = tmp_path / "other"
    other.mkdir()
    (other / "extras-trained.tar.part00").write_bytes(b"c" * 100)
    pack.write_manifest(other, {"target_sha256": "t2"})
    with pytest.raises(SystemExit, match="another pack"):
        pack.collect(other, tmp_path / "stage")


def test_repeat_says_whether_two_trainings_gave_the_same_checkpoint():
    a = {"target_sha256": "x", "loss_curve": [1.0], "train_config": {"seed": 1}, "gpu": "H100"}
    assert pack.repeat(a, dict(a))["identical"] is True
    b = dict(a, target_sha256="y", loss_curve=[1.5])
    r = pack.repeat(a, b)
    assert r["identical"] is False and r["loss_curves_equal"] is False and r["train_config_equal"] is True


def test_repeat_tells_a_setting_recorded_by_one_side_from_a_setting_that_differs():
    """083e4869 rebuilt on a second H200: the later record names seq_mask (a default the
    earlier one ran with but did not write) and the probe's looping prompts."""
    probe = {"looping_sequences": 4, "median_distinct_fraction": 0.2656}
    a = {"target_sha256": "x", "loss_curve": [1.0], "train_config": {"seed": 1}, "greedy_probe": probe}
    b = dict(a, train_config={"seed": 1, "seq_mask": "ngram"},
             greedy_probe=dict(probe, looping_prompts=[{"prompt": 21, "period": 9}]))
    r = pack.repeat(a, b)
    assert r["train_config_equal"] is False
    assert r["train_config_equal_where_both_record"] is True and r["train_config_recorded_by_one"] == ["seq_mask"]
    assert r["greedy_probe_equal_where_both_record"] is True
    c = dict(b, train_config={"seed": 2, "seq_mask": "ngram"}, greedy_probe=dict(probe, looping_sequences=5))
    r = pack.repeat(a, c)
    assert r["train_config_equal_where_both_record"] is False and r["greedy_probe_equal_where_both_record"] is False


def test_repeat_reads_a_drafter_record_and_ignores_the_curves_wall_clock():
    """The drafter d46bce41 rebuilt on a second H100 (2026-11-27): same weights, same losses,
    its curve's elapsed_s 25-30 % longer (the GPU was shared)."""
    a = {"drafter_sha256": "d", "target_sha256": "t", "train_config": {"steps": 2},
         "loss_curve": [{"step": 0, "loss": 33.39, "lr": 3e-05, "elapsed_s": 0.3}]}
    b = dict(a, loss_curve=[{"step": 0, "loss": 33.39, "lr": 3e-05, "elapsed_s": 0.4}])
    r = pack.repeat(a, b)
    assert r["checkpoint"] == "drafter_sha256" and r["identical"] is True and r["loss_curves_equal"] is True
    c = dict(b, loss_curve=[{"step": 0, "loss": 33.40, "lr": 3e-05, "elapsed_s": 0.4}])
    assert pack.repeat(a, c)["loss_curves_equal"] is False


def test_a_retrained_drafter_travels_alone_and_lands_over_the_carried_one(tmp_path):
    target = _checkpoint(tmp_path / "models-trained")
    want = json.loads((target / "train-record.json").read_text())["target_sha256"]
    drafter = tmp_path / "models-trained" / "dflash-r5-trained"
    drafter.mkdir()
    (drafter / "model.safetensors").write_bytes(b"old drafter")
    (drafter / "drafter-train-record.json").write_text(json.dumps({"target_sha256": want}))
    out = tmp_path / "out"
    out.mkdir()
    res = _remote("pack-trained", tmp_path, OUT=str(out), PACK_PARTS="0 1 2 3")
    assert res.returncode == 0, res.stderr
    # Retrained on the device: only the drafter comes back, whole, in one call.
    (drafter / "model.safetensors").write_bytes(b"new drafter")
    out_d = tmp_path / "out-drafter"
    res = _remote("pack-drafter", tmp_path, OUT=str(out_d), PACK_PART_BYTES="15900000")
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in out_d.iterdir()) == ["extras-update-drafter.json",
                                                         "extras-update-drafter.tar.part00"]
    stage = tmp_path / "stage"
    assert pack.collect(out, stage) == []
    assert pack.collect(out_d, stage, pack.DRAFTER_STEM) == []
    (stage / "bundle.json").write_text('{"sha256": "", "bytes": 0, "parts": []}\n')
    (tmp_path / "site").mkdir()
    env = {"MODELS_TRAINED": str(tmp_path / "fresh" / "models-trained"), "OUT": str(tmp_path / "o")}
    assert _remote("receive", tmp_path, **env).returncode == 0
    res = _remote("extras", tmp_path, **env)
    assert res.returncode == 0, res.stderr
    fresh = tmp_path / "fresh" / "models-trained"
    assert (fresh / "dflash-r5-trained" / "model.safetensors").read_bytes() == b"new drafter"
    assert (fresh / "trained-a4b-r30" / "model.safetensors").read_bytes() == \
        (target / "model.safetensors").read_bytes()


def test_pack_drafter_refuses_a_drafter_of_another_target(tmp_path):
    _checkpoint(tmp_path / "models-trained")
    drafter = tmp_path / "models-trained" / "dflash-r5-trained"
    drafter.mkdir()
    (drafter / "drafter-train-record.json").write_text(json.dumps({"target_sha256": "0" * 64}))
    res = _remote("pack-drafter", tmp_path, OUT=str(tmp_path / "out"))
    assert res.returncode != 0 and "train-drafter first" in res.stderr
    assert not (tmp_path / "out" / "extras-update-drafter.json").exists()


def _drafter_record(target_sha: str, drafter_sha: str, acceptance: float) -> dict:
    ev = {f"vllm-{v}": {"all_prompts": {"mean_acceptance_length": acceptance}} for v in ("0.21.0", "0.33.0")}
    return {"target_sha256": target_sha, "drafter_sha256": drafter_sha, "evaluation": ev}


@pytest.mark.parametrize("new_acceptance, replaced", [(2.9, True), (2.4, False)])
def test_a_background_retrain_replaces_the_drafter_only_when_it_accepts_no_less(tmp_path, new_acceptance,
                                                                                 replaced):
    target = _checkpoint(tmp_path / "models-trained")
    want = json.loads((target / "train-record.json").read_text())["target_sha256"]
    old = tmp_path / "models-trained" / "dflash-r5-trained"
    old.mkdir()
    (old / "model.safetensors").write_bytes(b"old drafter")
    (old / "drafter-train-record.json").write_text(json.dumps(_drafter_record(want, "old", 2.53)))
    # What drafter-bg leaves behind when its training has ended (remote.sh drafter_background).
    work = tmp_path / "work"
    nxt = work / "drafter-next" / "dflash-r5-trained"
    nxt.mkdir(parents=True)
    (nxt / "model.safetensors").write_bytes(b"new drafter")
    (nxt / "drafter-train-record.json").write_text(json.dumps(_drafter_record(want, "new", new_acceptance)))
    (work / "drafter-bg.asked").write_text("")
    (work / "drafter-bg.rc").write_text("0\n")
    (work / "drafter-bg.out").write_text("trained\n")
    res = _remote("pack-drafter", tmp_path, OUT=str(tmp_path / "out"), PACK_PART_BYTES="15900000")
    assert res.returncode == 0, res.stderr
    on_disk = (old / "model.safetensors").read_bytes()
    assert on_disk == (b"new drafter" if replaced else b"old drafter")
    assert ("kept the old one" in res.stdout) is (not replaced)


def test_better_refuses_a_record_without_an_evaluation():
    with pytest.raises(ValueError, match="no evaluation"):
        pack.better({"target_sha256": "x"}, _drafter_record("x", "old", 2.5))
    stale = _drafter_record("another target", "old", 3.5)
    assert pack.better(_drafter_record("x", "new", 2.0), stale)["replace"] is True


def test_extras_before_the_install_keeps_fa2_for_later_and_still_unpacks_the_checkpoints(tmp_path):
    """On 2026-11-27 a background `extras` ran before the bundle's install had made $SITE: the FA2
    copy failed and set -e stopped it before extras-trained. FA2 now waits, unmarked."""
    import lzma
    import tarfile

    target = _checkpoint(tmp_path / "models-trained")
    out = tmp_path / "out"
    out.mkdir()
    assert _remote("pack-trained", tmp_path, OUT=str(out), PACK_PARTS="0 1 2 3").returncode == 0
    stage = tmp_path / "stage"
    pack.collect(out, stage)
    fa2 = tmp_path / "fa2-src" / "fa2"
    fa2.mkdir(parents=True)
    (fa2 / "_vllm_fa2_C.abi3.so.xz").write_bytes(lzma.compress(b"not a real library"))
    with tarfile.open(tmp_path / "extras-fa2.tar", "w") as tar:
        tar.add(fa2, arcname="fa2")
    _load("stage").split(tmp_path / "extras-fa2.tar", stage, "extras-fa2")
    (stage / "bundle.json").write_text('{"sha256": "", "bytes": 0, "parts": []}\n')
    env = {"MODELS_TRAINED": str(tmp_path / "fresh" / "models-trained"), "OUT": str(tmp_path / "o")}
    assert _remote("receive", tmp_path, **env).returncode == 0
    res = _remote("extras", tmp_path, **env)  # $SITE does not exist: no install has run
    assert res.returncode == 0, res.stderr
    assert "extras-fa2: vLLM is not in" in res.stdout and "extras-trained installed" in res.stdout
    assert not (tmp_path / "site" / ".extras-fa2-installed").exists()
    assert (tmp_path / "site" / ".extras-trained-installed").exists()
    unpacked = tmp_path / "fresh" / "models-trained" / "trained-a4b-r30" / "model.safetensors"
    assert unpacked.read_bytes() == (target / "model.safetensors").read_bytes()


def _probe(loops: int, sequences: int = 36, full: int = 36) -> dict:
    return {"sequences": sequences, "constant_sequences": 0, "median_distinct_fraction": 0.4, "near_ties": 0,
            "nan_positions": 0, "looping_sequences": loops, "prompts": sequences, "prompts_full_length": full,
            "min_generated_tokens": 128}


def test_the_chain_trains_a_drafter_only_for_a_target_that_passes_the_gate(tmp_path, capsys):
    def record(name, content):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(content))
        return str(path)

    assert pack.main(["gate", record("pass", {"target_sha256": "ab" * 32, "greedy_probe": _probe(3)})]) == 0
    # 4 of 36 looping is over 10 %
    assert pack.main(["gate", record("loops", {"target_sha256": "ab" * 32, "greedy_probe": _probe(4)})]) == 3
    assert "4 of 36 sequences looping" in capsys.readouterr().out
    # too few prompts of 128 tokens, and a record with no probe at all
    assert pack.main(["gate", record("short", {"greedy_probe": _probe(0, full=31)})]) == 3
    assert pack.main(["gate", record("none", {})]) == 3


def test_has_and_same_read_records_and_say_no_for_a_missing_or_broken_file(tmp_path):
    a, b, broken = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "broken.json"
    a.write_text(json.dumps({"target_sha256": "t1", "polished_from": "x", "empty": ""}))
    b.write_text(json.dumps({"target_sha256": "t1"}))
    broken.write_text("{not json")
    assert pack.main(["has", str(a), "polished_from"]) == 0
    assert pack.main(["has", str(a), "empty"]) == 1 and pack.main(["has", str(b), "polished_from"]) == 1
    assert pack.main(["has", str(tmp_path / "none.json"), "x"]) == 1 and pack.main(["has", str(broken), "x"]) == 1
    nested = tmp_path / "nested.json"
    nested.write_text('{"train_config": {"seq_prefix_cycle": [128, 1280], "empty": []}, "flat": 3}')
    assert pack.main(["has", str(nested), "train_config.seq_prefix_cycle"]) == 0
    assert pack.main(["has", str(nested), "train_config.empty"]) == 1
    assert pack.main(["has", str(nested), "train_config.missing"]) == 1 and pack.main(["has", str(nested), "flat.x"]) == 1
    assert pack.main(["same", str(a), str(b), "target_sha256"]) == 0
    b.write_text(json.dumps({"target_sha256": "t2"}))
    assert pack.main(["same", str(a), str(b), "target_sha256"]) == 1
    assert pack.main(["same", str(a), str(b), "drafter_sha256"]) == 1  # unset on both is not "the same"


def test_identity_checks_the_checkpoint_against_its_record(tmp_path, capsys):
    trained = tmp_path / "trained"
    trained.mkdir()
    (trained / "model.safetensors").write_bytes(b"weights")
    (trained / "config.json").write_text("{}")
    (trained / "train-record.json").write_text(json.dumps({"target_sha256": tt.checkpoint_sha256(trained)}))
    assert pack.main(["identity", str(trained)]) == 0
    assert "(matches its train record)" in capsys.readouterr().out
    (trained / "model.safetensors").write_bytes(b"other weights")
    assert pack.main(["identity", str(trained)]) == 1
    assert "is not its record's" in capsys.readouterr().err


def test_choose_polish_keeps_the_passing_polish_whose_last_validation_probe_loops_least(tmp_path):
    """The rule train_target.POLISH_LONG's comment fixed: gate first (the greedy probes of the
    committed records: 083e4869's passes, e3f0284d's fails), then the fewest loops at the last
    validation probe, a tie keeping "long"."""
    results = Path(pack.__file__).resolve().parents[1] / "results" / "trained" / "target-2026-11-29"
    passing = json.loads((results / "polish-record-083e4869-h200.json").read_text())["greedy_probe"]
    failing = json.loads((results / "train-record-e3f0284d-h200.json").read_text())["greedy_probe"]

    def rec(probe, *loops):
        return {"greedy_probe": probe, "polished_from": {"target_sha256": "p2"},
                "sequence_phase": {"validation_probes": [{"step": 15 * i, "looping_sequences": n}
                                                         for i, n in enumerate(loops)]}}

    assert pack.choose_polish({"long": rec(passing, 9, 4), "long-heavy": rec(passing, 1, 3)}) == "long-heavy"
    assert pack.choose_polish({"long": rec(passing, 0, 3), "long-heavy": rec(passing, 5, 3)}) == "long"
    assert pack.choose_polish({"long-heavy": rec(passing, 5, 3), "long": rec(passing, 0, 3)}) == "long"
    assert pack.choose_polish({"long": rec(failing, 0, 0), "long-heavy": rec(passing, 6, 6)}) == "long-heavy"
    assert pack.choose_polish({"long": rec(failing, 1), "long-heavy": rec(failing, 1)}) is None
    other = rec(passing, 0)
    other["polished_from"] = {"target_sha256": "another"}
    with pytest.raises(ValueError, match="one target"):
        pack.choose_polish({"long": rec(passing, 1), "long-heavy": other})
    import train_target

    def made_by(record, name):
        recipe = json.loads(json.dumps(train_target.POLISH_RECIPES[name]))
        return {**record, "polished_from": {"target_sha256": "p2", "recipe": recipe},
                "train_config": {**recipe, "seed": 1}}

    a, b, c = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"
    a.write_text(json.dumps(made_by(rec(passing, 2), "long")))
    b.write_text(json.dumps(made_by(rec(failing, 0), "long-heavy")))
    overridden = made_by(rec(passing, 2), "long")
    overridden["train_config"]["seq_steps"] = 5
    c.write_text(json.dumps(overridden))
    assert pack.main(["choose-polish", f"long={a}", f"long-heavy={b}"]) == 0
    assert pack.main(["choose-polish", f"long-heavy={b}"]) == 3
    assert pack.main(["choose-polish", f"long-heavy={a}"]) == 2  # a record of the other recipe
    assert pack.main(["choose-polish", f"long={c}"]) == 2  # an override beside the recipe
    assert pack.main(["choose-polish", str(a)]) == 2 and pack.main(["choose-polish", f"long={a}", f"long={a}"]) == 2
    assert pack.main(["polished-by", str(a), "long"]) == 0 and pack.main(["polished-by", str(a), "long-heavy"]) == 1
    assert pack.main(["polished-by", str(c), "long"]) == 1 and pack.main(["polished-by", str(a), "polish"]) == 1
    assert pack.main(["polished-by", str(tmp_path / "none.json"), "long"]) == 1
