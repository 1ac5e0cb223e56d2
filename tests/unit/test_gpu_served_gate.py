"""served_gate.py: which candidate target's served references pass the gate on every release,
and reproduce. Synthetic twins for the rule; the committed twins (an H200, exact numerics) for
the recorded verdict."""

from __future__ import annotations

import io
import json
import random
import sys
import tarfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
import gpu_paths  # noqa: E402,F401
import served_gate  # noqa: E402
import trained_pack  # noqa: E402

RESULTS = Path(served_gate.__file__).resolve().parents[1] / "results" / "trained" / "target-2026-11-29"


def _diverse(seed: int, n: int = 128) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10, 8000) for _ in range(n)]


def _looping(seed: int) -> list[int]:
    return _diverse(seed, 40) + [5, 6, 7, 8, 9] * 18  # its last 64 tokens repeat with period 5


def _twin(loops: int, seed: int = 0, prompts: int = 36) -> dict:
    rows = [{"token_ids": _looping(seed + i) if i < loops else _diverse(seed + i)} for i in range(prompts)]
    return {"rows": rows, "series": "s"}


def test_a_target_is_kept_only_when_every_release_passes_and_reproduces():
    twins = {"a:0.21.0:1": _twin(4), "a:0.21.0:2": _twin(4), "a:0.33.0:1": _twin(1), "a:0.33.0:2": _twin(1),
             "b:0.21.0:1": _twin(3), "b:0.21.0:2": _twin(3), "b:0.33.0:1": _twin(0), "b:0.33.0:2": _twin(0)}
    verdict = served_gate.judge(twins, ["a", "b"])
    assert verdict["releases"] == ["0.21.0", "0.33.0"]
    # 4 of 36 is over the bars' 10 %, 3 of 36 is not
    assert verdict["pairs"]["a:0.21.0"] == {"runs": ["a:0.21.0:1", "a:0.21.0:2"], "passes": False,
                                            "looping_sequences": [4, 4], "reproduces": True}
    assert verdict["targets"]["a"] == {"passes_every_release": False, "reproduces_every_release": True}
    assert verdict["targets"]["b"] == {"passes_every_release": True, "reproduces_every_release": True}
    assert verdict["kept"] == "b"
    assert verdict["twins"]["a:0.21.0:1"]["looping_prompts"] == [{"prompt": i, "period": 5} for i in range(4)]


def test_the_preferred_target_wins_when_both_pass_and_one_run_is_not_a_reproduction():
    both = {"a:x:1": _twin(0), "a:x:2": _twin(0), "b:x:1": _twin(0), "b:x:2": _twin(0)}
    assert served_gate.judge(both, ["b", "a"])["kept"] == "b"
    assert served_gate.judge(both, ["a", "b"])["kept"] == "a"
    once = {"a:x:1": _twin(0), "b:x:1": _twin(0), "b:x:2": _twin(0)}
    assert served_gate.judge(once, ["a", "b"])["kept"] == "b"  # a: one run, nothing reproduced
    differ = {"a:x:1": _twin(0), "a:x:2": _twin(0, seed=100)}
    assert served_gate.judge(differ, ["a"])["pairs"]["a:x"]["reproduces"] is False
    assert served_gate.judge(differ, ["a"])["kept"] is None
    # a target with no twin on one of the releases has not passed there
    partial = {"a:x:1": _twin(0), "a:x:2": _twin(0), "a:y:1": _twin(0), "a:y:2": _twin(0),
               "b:x:1": _twin(0), "b:x:2": _twin(0)}
    assert served_gate.judge(partial, ["b", "a"])["kept"] == "a"


def test_bad_labels_and_preferences_are_refused(capsys):
    with pytest.raises(ValueError, match="TARGET:RELEASE"):
        served_gate.parse_label("a")
    with pytest.raises(ValueError, match="TARGET:RELEASE"):
        served_gate.parse_label("a::1")
    with pytest.raises(ValueError, match="no twin"):
        served_gate.judge({"a:x:1": _twin(0)}, ["a", "c"])
    with pytest.raises(SystemExit):
        served_gate.main(["--twin", "a:x", "--prefer", "a"])
    assert "LABEL=PATH" in capsys.readouterr().err


def test_one_file_or_one_run_given_twice_is_refused(tmp_path, capsys):
    path, other = tmp_path / "t.json", tmp_path / "u.json"
    for p in (path, other):
        p.write_text(json.dumps(_twin(0)))
    # "a:x" is run 1 of a at x: naming it again as a:x:1 is the same run
    with pytest.raises(SystemExit):
        served_gate.main(["--twin", f"a:x={path}", "--twin", f"a:x:1={other}", "--prefer", "a"])
    assert "given twice" in capsys.readouterr().err
    # one file is one run: as run 1 and run 2 it would "reproduce" itself
    with pytest.raises(SystemExit):
        served_gate.main(["--twin", f"a:x:1={path}", "--twin", f"a:x:2={tmp_path}/../{tmp_path.name}/t.json",
                          "--prefer", "a"])
    assert "is also a:x:1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        served_gate.main(["--twin", f"a:x:1={tmp_path / 'missing.json'}", "--prefer", "a"])
    assert "missing.json" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        served_gate.main(["--twin", f"a:x:1={path}", "--prefer", ","])
    assert "at least one target" in capsys.readouterr().err
    # two files of one target agreeing: kept, exit 0, the record written
    out = tmp_path / "verdict.json"
    assert served_gate.main(["--twin", f"a:x:1={path}", "--twin", f"a:x:2={other}", "--prefer", "a",
                             "--out", str(out)]) == 0
    assert json.loads(out.read_text())["kept"] == "a"


def _committed_twins(*archives: str) -> dict[str, dict]:
    twins = {}
    for archive in archives or ("served-twins-2026-11-30.tar.xz",):
        with tarfile.open(RESULTS / archive) as tar:
            for member in tar.getmembers():
                if member.name.endswith(".json"):
                    target, release, run = member.name[:-len(".json")].split("-")
                    label = f"{target}:{release}:{run[len('run'):]}"
                    assert label not in twins, f"{label} twice"
                    twins[label] = json.load(io.TextIOWrapper(tar.extractfile(member)))
    return twins


def test_the_recorded_served_gate_is_what_the_committed_twins_give():
    """The second polish's candidates served by both releases (exact numerics, one prompt at a
    time): the verdict record replays from the raw twins, and says what it says below."""
    recorded = json.loads((RESULTS / "served-gate-2026-11-30.json").read_text())
    twins = _committed_twins()
    assert served_gate.judge(twins, recorded["prefer"]) == recorded
    # the pick of choose-polish (the rule fixed before either polish ran) is preferred first
    records = {"long": json.loads((RESULTS / "polish-record-84c26c18-h200-long.json").read_text()),
               "long-heavy": json.loads((RESULTS / "polish-record-9b666f25-h200-long-heavy.json").read_text())}
    assert trained_pack.choose_polish(records) == "long-heavy"
    assert records["long-heavy"]["target_sha256"].startswith(recorded["prefer"][0])
    # its 0.21.0 references loop in 4 of 36, twice alike: over the gate's 3
    assert recorded["pairs"]["9b666f25:0.21.0"]["looping_sequences"] == [4, 4]
    assert recorded["pairs"]["9b666f25:0.21.0"]["reproduces"] is True
    # the other passes on both releases, each served once: not kept until a second run agrees
    assert recorded["targets"]["84c26c18"] == {"passes_every_release": True, "reproduces_every_release": False}
    assert recorded["kept"] is None
    # every twin ran the current series of its release
    assert {b["series"][:8] for label, b in recorded["twins"].items() if ":0.21.0:" in label} == {"d5c6c37d"}
    assert {b["series"][:8] for label, b in recorded["twins"].items() if ":0.33.0:" in label} == {"33ead67f"}


def test_the_second_served_run_keeps_84c26c18():
    """84c26c18 served again on both releases, on another host that rebuilt it from 083e4869
    (rebuild-84c26c18-h200.json): the verdict replays from both archives of raw twins."""
    recorded = json.loads((RESULTS / "served-gate-84c26c18.json").read_text())
    twins = _committed_twins("served-twins-2026-11-30.tar.xz", "served-twins-84c26c18-run2.tar.xz")
    assert served_gate.judge(twins, recorded["prefer"]) == recorded
    # the same order as before: choose-polish's pick first, and it still fails on 0.21.0
    assert recorded["prefer"] == json.loads((RESULTS / "served-gate-2026-11-30.json").read_text())["prefer"]
    assert recorded["targets"]["9b666f25"]["passes_every_release"] is False
    # the second runs gave the first runs' tokens, and each stays under the gate
    for release in ("0.21.0", "0.33.0"):
        pair = recorded["pairs"][f"84c26c18:{release}"]
        assert pair["reproduces"] is True and pair["passes"] is True
        assert pair["looping_sequences"] == [2, 2]
    assert recorded["kept"] == "84c26c18"
    # the target served the second time is the recorded one, rebuilt bit for bit
    rebuild = json.loads((RESULTS / "rebuild-84c26c18-h200.json").read_text())
    assert rebuild["reproduced"] is True
    assert rebuild["polish_again"]["again"] == rebuild["polish_again"]["first"]
    assert rebuild["polish_again"]["first"].startswith(recorded["kept"])
    assert {b["series"][:8] for label, b in recorded["twins"].items() if ":0.21.0:" in label} == {"d5c6c37d"}
    assert {b["series"][:8] for label, b in recorded["twins"].items() if ":0.33.0:" in label} == {"33ead67f"}
