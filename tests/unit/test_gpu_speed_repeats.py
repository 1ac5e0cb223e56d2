"""speed_repeats.py: the served speed pair's runs side by side (issue 51).

The hand-built archives below have known answers by construction: which prompts loop, where an
output parts from its exact twin (and the twin's margin there), and how many outputs two runs
share. The last test re-runs the documented command on the committed archives and checks that
the committed record is its output.
"""

from __future__ import annotations

import io
import json
import random
import tarfile
from pathlib import Path

import pytest

from tests.unit.gpu_scripts import load as _load

sr = _load("speed_repeats")

RESULTS = Path(__file__).resolve().parents[1] / "gpu" / "results"
PROMPTS = 4
TARGET = "7" * 64


def _diverse(seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(5000) for _ in range(128)]


def _loop() -> list[int]:
    return [7, 8, 9, 10] * 32


def _twins(tokens: list[list[int]], target: str = TARGET) -> dict:
    return {"target_sha256": target,
            "rows": [{"token_ids": t, "margins": [1.0] * 128, "prompt_tokens": 10 + i} for i, t in enumerate(tokens)]}


def _bench(outputs: list[list[int]], tok_s: float, speedup: float) -> dict:
    return {"prompts_file": {"prompts": PROMPTS}, "runs": [{"concurrency": 1, "outputs": outputs}],
            "comparison": [{"concurrency": 1, "output_tok_s": {"with_drafter": tok_s, "without": tok_s / speedup},
                            "speedup": speedup, "requests": {"with_drafter": PROMPTS, "without": PROMPTS},
                            "mean_acceptance_length": 3.0}]}


def _served(tok_s: float, over: float, loops: dict | None = None) -> dict:
    return {"servers": [{"server": "speed", "vllm": "0.21.0", "target_sha256": TARGET,
                         "nondegenerate": {side: {"looping_prompts": k} for side, k in (loops or {}).items()},
                         "speed": [{"concurrency": 1, "output_tok_s": {"with_drafter": tok_s},
                                    "measured_over_projected": over}]}]}


def _tar(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:xz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _archive(tmp_path: Path, stem: str, dflash: list, reference: list, tok_s: float, speedup: float,
             over: float, loops: dict | None = None) -> Path:
    prompts = "".join(json.dumps({"prompt": list(range(10 + i))}) + "\n" for i in range(PROMPTS))
    return _tar(tmp_path / f"{stem}.tar.xz", {
        f"{stem}/served.json": json.dumps(_served(tok_s, over, loops)).encode(),
        f"{stem}/served-out/served-logs/speed-prompts.jsonl": prompts.encode(),
        f"{stem}/served-out/served-bench-0.21.0-speed-dflash.json": json.dumps(_bench(dflash, tok_s, speedup)).encode(),
        f"{stem}/served-out/served-bench-0.21.0-speed-no-drafter.json":
            json.dumps(_bench(reference, tok_s, speedup)).encode()})


def _exact(tmp_path: Path, twins: dict) -> Path:
    return _tar(tmp_path / "exact.tar.xz", {"served/conformance-twin.json": json.dumps(twins).encode()})


def _served_file(tmp_path: Path, tok_s: float) -> Path:
    path = tmp_path / "served.json"
    path.write_text(json.dumps(_served(tok_s, 0.0)))
    return path


def test_each_run_beside_the_others_from_its_raw_outputs(tmp_path):
    same = [_diverse(i) for i in range(PROMPTS)]
    twins = _twins(same)
    twins["rows"][1]["margins"][40] = 0.0625  # a near tie where one run's output parts
    parted = same[1][:40] + [4999 - t for t in same[1][40:]]
    first = _archive(tmp_path, "speed-a", same, [same[0], parted, same[2], same[3]], 300.0, 1.2, 0.9)
    # the page's row, with the loops it stored for each side (one that disagrees with the tokens)
    second = _archive(tmp_path, "speed-b", same, [same[0], same[1], same[2], _loop()], 400.0, 1.4, 1.05,
                      loops={"reference": [3], "dflash": [2]})

    doc = sr.build([first, second], _exact(tmp_path, twins), _served_file(tmp_path, 400.0))

    row, other = doc["runs"]
    assert (row["archive"], row["row_on_served_md"], other["row_on_served_md"]) == ("speed-b.tar.xz", True, False)
    assert (row["speedup_c1"], row["measured_over_projected_c1"]) == (1.4, 1.05)
    assert (other["speedup_c1"], other["measured_over_projected_c1"]) == (1.2, 0.9)
    assert row["reference"]["looping_prompts"] == [3] and other["reference"]["looping_prompts"] == []
    assert (row["reference"]["agrees_with_row"], row["dflash"]["agrees_with_row"]) == (True, False)
    assert other["reference"]["agrees_with_row"] is None  # its served.json row stored no loops
    assert row["dflash"]["exact"]["identical"] == PROMPTS
    assert row["reference"]["exact"]["looping"] == [{"prompt": 3, "position": 0, "margin": 1.0}]
    assert row["reference"]["exact"]["looping_max_margin"] == 1.0
    assert other["reference"]["exact"]["identical"] == 3
    assert other["reference"]["exact"]["max_margin_at_first_divergence"] == 0.0625
    assert other["reference"]["exact"]["looping_max_margin"] is None
    assert doc["repeats"] == [{"vllm": "0.21.0", "runs": ["speed-b.tar.xz", "speed-a.tar.xz"],
                               "identical": {"dflash": PROMPTS, "reference": 2},
                               "prompts": {"dflash": PROMPTS, "reference": PROMPTS}}]


def test_a_looping_output_equal_to_a_looping_twin_says_so_and_a_short_one_is_not_identical(tmp_path):
    same = [_loop()] + [_diverse(i) for i in range(1, PROMPTS)]
    short = [same[0], same[1][:20], same[2], same[3]]
    run = _archive(tmp_path, "speed-a", same, short, 400.0, 1.4, 1.05)
    rec = sr.build([run], _exact(tmp_path, _twins(same)), _served_file(tmp_path, 1.0))["runs"][0]
    assert rec["dflash"]["exact"]["looping"] == [{"prompt": 0, "twin_loops": True}]
    assert rec["dflash"]["exact"]["looping_unexplained"] == 0
    assert rec["reference"]["exact"]["identical"] == PROMPTS - 1  # the 20-token output ends early
    assert rec["row_on_served_md"] is False


def test_twins_of_another_target_are_not_compared_and_an_empty_side_says_so(tmp_path):
    same = [_diverse(i) for i in range(PROMPTS)]
    run = _archive(tmp_path, "speed-a", same, [[]] * PROMPTS, 400.0, 1.4, 1.05)
    rec = sr.build([run], _exact(tmp_path, _twins(same, target="8" * 64)), _served_file(tmp_path, 1.0))["runs"][0]
    assert rec["exact_twins"] == "the run's target is not the twins'"
    assert "exact" not in rec["dflash"]
    assert rec["reference"] == {"outputs": 0, "looping_prompts": [], "gate_failures": ["no output"]}
    out = tmp_path / "out.json"
    assert sr.main(["--archive", str(run), "--exact", str(_exact(tmp_path, _twins(same))),
                    "--served", str(_served_file(tmp_path, 1.0)), "--out", str(out)]) == 0


def test_an_archive_without_its_benchmark_file_names_itself(tmp_path):
    bad = _tar(tmp_path / "speed-x.tar.xz", {"speed-x/served.json": b"{}"})
    with pytest.raises(SystemExit, match="speed-x.tar.xz: 0 members are served-bench-"):
        sr.build([bad], _exact(tmp_path, _twins([_diverse(0)])), _served_file(tmp_path, 1.0))


def test_the_committed_record_is_the_documented_commands_output(tmp_path):
    out = tmp_path / "speed-repeats.json"
    assert sr.main(["--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc == json.loads((RESULTS / "served" / "speed-repeats.json").read_text())
    # the tokens read here give the loops served.py stored in each run's row
    assert all(r[side]["agrees_with_row"] for r in doc["runs"] for side in ("dflash", "reference"))
