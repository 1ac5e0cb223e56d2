"""tests/gpu/runs/spec_probe.py's check, on CPU tensors (its hooks need vLLM on a GPU host).

The probe must report every id or position outside its table, negative ones
included (Inductor's gather asserts 0 <= index < rows), and stay silent on
values in range, so a run without reports means no bad value entered.
"""

from __future__ import annotations

import json

import torch

from tests.unit.gpu_scripts import load as _load

sp = _load("spec_probe")


def test_out_of_range_values_are_reported_with_their_positions(tmp_path):
    out = tmp_path / "probe.jsonl"
    probe = sp._Probe(out, vocab=4096, max_positions=4096)
    assert probe.check("drafter", "positions", torch.arange(0, 272), 4096) is True
    assert not out.exists()
    bad = torch.tensor([5, 4096, 7, -1, 9000])
    assert probe.check("drafter", "input_ids", bad, 4096, {"num_input_tokens": 512}) is False
    entry = json.loads(out.read_text().splitlines()[0])
    assert entry["bad_index"] == [1, 3, 4] and entry["bad_values"] == [4096, -1, 9000]
    assert entry["bad_count"] == 3 and entry["num_input_tokens"] == 512
    probe.summary()
    summary = json.loads(out.read_text().splitlines()[-1])
    assert summary == {"summary": True, "checks": {"target": 0, "drafter": 0}, "reports": 1}
