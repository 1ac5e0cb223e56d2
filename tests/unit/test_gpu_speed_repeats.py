"""speed_repeats.py: the served speed pair's runs side by side (issue 51).

The hand-built archives below have known answers by construction: which prompts loop, where an
output parts from its exact twin (and the twin's margin there), and how many outputs two runs
share. The last test re-runs the documented command on the committed archives and checks that
the committed record is its output.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from tests.unit.gpu_scripts import json_tar
from tests.unit.gpu_scripts import load as _load

gate = _load("gate")
sr = _load("speed_repeats")

RESULTS = Path(__file__).resolve().parents[1] / "gpu" / "results"
PROMPTS = 4


def _diverse(seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(5000) for _ in range(128)]


def _loop() -> list[int]:
    return [7, 8, 9, 10] * 32


def _bench(outputs: list[list[int]], tok_s: float, speedup: float) -> dict:
    return {"prompts_file": {"prompts": PROMPTS}, "runs": [{"concurrency": 1, "outputs": outputs}],
            "comparison": [{"concurrency": 1, "output_tok_s": {"with_drafter": tok_s, "without": tok_s / speedup},
                            "speedup": speedup, "requests": {"with_drafter": PROMPTS, "without": PROMPTS},
                            "mean_acceptance_length": 3.0}]}


def _served(tok_s: float, over: float) -> dict:
    return {"servers": [{"server": "speed", "vllm": "0.21.0", "speed": [
        {"concurrency": 1, "output_tok_s": {"with_drafter": tok_s}, "measured_over_projected": over}]}]}


def _archive(tmp_path: Path, stem: str, dflash: list, reference: list, tok_s: float, speedup: float) -> Path:
    return json_tar(tmp_path / f"{stem}.tar.xz", {
        f"{stem}/served.json": _served(tok_s, 1.05),
        f"{stem}/served-out/served-bench-0.21.0-speed-dflash.json": _bench(dflash, tok_s, speedup),
        f"{stem}/served-out/served-bench-0.21.0-speed-no-drafter.json": _bench(reference, tok_s, speedup)})


def test_each_run_beside_the_others_from_its_raw_outputs(tmp_path):
    twins = [{"token_ids": _diverse(i), "margins": [1.0] * 128} for i in range(PROMPTS)]
    twins[1]["margins"][40] = 0.0625  # a near tie where the other run's output parts
    exact = json_tar(tmp_path / "exact.tar.xz", {"served/conformance-twin.json": {"rows": twins}})
    parted = twins[1]["token_ids"][:40] + [4999 - t for t in twins[1]["token_ids"][40:]]
    same = [t["token_ids"] for t in twins]
    first = _archive(tmp_path, "speed-a", same, [same[0], same[1], same[2], _loop()], 400.0, 1.4)
    second = _archive(tmp_path, "speed-b", same, [same[0], parted, same[2], same[3]], 300.0, 1.2)
    served = tmp_path / "served.json"
    served.write_text(json.dumps(_served(400.0, 1.05)))  # the first run is the page's row

    doc = sr.build([second, first], exact, served)

    a, b = doc["runs"]
    assert (a["archive"], a["row_on_served_md"], b["row_on_served_md"]) == ("speed-a.tar.xz", True, False)
    assert (a["speedup_c1"], b["speedup_c1"], a["measured_over_projected_c1"]) == (1.4, 1.2, 1.05)
    assert a["reference"]["looping_prompts"] == [3] and b["reference"]["looping_prompts"] == []
    assert a["dflash"]["exact"]["identical"] == PROMPTS
    assert a["reference"]["exact"]["looping"] == [{"prompt": 3, "position": 0, "margin": 1.0}]
    assert b["reference"]["exact"]["identical"] == 3
    assert b["reference"]["exact"]["max_margin_at_first_divergence"] == 0.0625
    assert a["reference"]["exact"]["looping_max_margin"] == 1.0 and b["reference"]["exact"]["looping_max_margin"] is None
    assert doc["repeats"] == [{"vllm": "0.21.0", "runs": ["speed-a.tar.xz", "speed-b.tar.xz"],
                               "identical": {"dflash": PROMPTS, "reference": 2}, "prompts": PROMPTS}]


def test_a_looping_output_whose_twin_loops_too_says_so(tmp_path):
    twins = [{"token_ids": _loop(), "margins": [1.0] * 128}] + \
        [{"token_ids": _diverse(i), "margins": [1.0] * 128} for i in range(1, PROMPTS)]
    exact = json_tar(tmp_path / "exact.tar.xz", {"served/conformance-twin.json": {"rows": twins}})
    same = [t["token_ids"] for t in twins]
    run = _archive(tmp_path, "speed-a", same, same, 400.0, 1.4)
    served = tmp_path / "served.json"
    served.write_text(json.dumps({"servers": []}))
    rec = sr.build([run], exact, served)["runs"][0]
    assert rec["reference"]["exact"]["looping"] == [{"prompt": 0, "twin_loops": True}]
    assert rec["row_on_served_md"] is False and rec["measured_over_projected_c1"] == 1.05


def test_the_committed_record_is_the_documented_commands_output(tmp_path):
    out = tmp_path / "speed-repeats.json"
    assert sr.main(["--out", str(out)]) == 0
    assert json.loads(out.read_text()) == json.loads((RESULTS / "served" / "speed-repeats.json").read_text())
