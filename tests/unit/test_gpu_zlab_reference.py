"""tests/gpu/models/zlab_reference.py: z-lab's dflash_generate run for real, on the CPU, on a tiny target.

``dflash_generate`` needs transformers 5.15+ (``DynamicCache.activate_past_recording``); the
launcher venv has 5.13.1, so the runner runs in a subprocess with transformers 5.17.0 put first
on its path (installed once into the launcher's cache, as test_gpu_lm_files does). The target and
drafter are random: what is checked is the runner (two passes, acceptance bookkeeping, the
embedding wrapper, the record), not acceptance itself, which needs a trained drafter and a GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.gpu_scripts import GPU_DIR, load, tiny_gemma4_target, transformers_517

torch = pytest.importorskip("torch", reason="the launcher venv installs CPU torch for these tests")
pytest.importorskip("dflash", reason="make test installs dflash==0.1.0 (--no-deps) into the venv")

mc, tt, zr = load("make_checkpoints"), load("train_target"), load("zlab_reference")
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    model, _ = tiny_gemma4_target(6)
    with torch.no_grad():  # a spread of logits, so outputs are not one repeated token
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.3)
    target = root / tt.TARGET.name
    model.to(torch.bfloat16).save_pretrained(target)
    prompts = [{"token_ids": [2] + list(range(30, 30 + n)), "max_tokens": MAX_TOKENS} for n in (4, 11, 19)]
    (target / "prompts.json").write_text(json.dumps(prompts))
    (target / "train-record.json").write_text(json.dumps({"target_sha256": "t" * 64}))
    shape = mc.DrafterShape("drafter", "t", 2, [1, 3], hidden_size=64, num_attention_heads=2,
                            num_key_value_heads=1, head_dim=32,
                            layer_types=["sliding_attention", "full_attention"], sliding_window=8)
    mc.write_drafter(shape, root / "drafter", config=mc.drafter_config_dict(
        shape, vocab=256, mask_token_id=tt.lm_files.CONFIG_IDS["mask_token_id"], num_target_layers=6))
    return root, prompts


@pytest.fixture(scope="module")
def record(models):
    root, _ = models
    out = root / "zlab.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(transformers_517()), str(GPU_DIR), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, str(GPU_DIR / "models" / "zlab_reference.py"), str(root), "--drafter", "drafter",
                           "--out", str(out), "--device", "cpu", "--max-tokens", str(MAX_TOKENS)],
                          capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_two_passes_of_z_labs_loop_agree_and_every_token_is_counted(record, models):
    _, prompts = models
    assert record["passes_identical"] is True
    assert record["transformers"] == "5.17.0"
    assert record["prompts"] == len(prompts) == len(record["rows"])
    for row in record["rows"]:
        assert len(row["token_ids"]) == MAX_TOKENS
        # acceptance lengths are tokens produced per verify step: together, every output token
        # but the first (the prefill's)
        assert sum(row["acceptance_lengths"]) == MAX_TOKENS - 1
        assert all(1 <= a <= record["block_size"] for a in row["acceptance_lengths"])
        assert len(row["margins"]) == MAX_TOKENS
    acc = record["acceptance"]
    assert acc["verify_steps"] == sum(len(r["acceptance_lengths"]) for r in record["rows"])
    assert "sqrt(hidden_size)" in record["deviation"]


def test_z_labs_output_is_the_targets_own_greedy_text(record, models):
    """Lossless by construction: what the loop emits is the target's greedy continuation (here
    compared with the one-token-at-a-time decode of the same bf16 checkpoint)."""
    root, prompts = models
    td = load("train_drafter")
    target = td.load_target(root / tt.TARGET.name, "cpu")
    fd = load("fast_decode")
    for p, row in zip(prompts, record["rows"]):
        greedy, _ = fd.greedy(target, [p["token_ids"]], MAX_TOKENS, graph=False)
        assert row["token_ids"] == greedy[0]
    assert len({t for r in record["rows"] for t in r["token_ids"]}) > 3  # not one repeated token


def test_the_wrapper_hands_the_loop_gemmas_scaled_table():
    model, _ = tiny_gemma4_target(2)
    wrapped = zr.GemmaEmbeddingTarget(model)
    ids = torch.tensor([[2, 30, 31]])
    emb = model.get_input_embeddings()
    scaled = torch.nn.functional.embedding(ids, wrapped.get_input_embeddings().weight)
    assert torch.equal(scaled, emb(ids))  # the target's own (scaled) embedding, bit for bit
    raw = torch.nn.functional.embedding(ids, emb.weight)
    assert not torch.allclose(raw, scaled)  # z-lab's torch loop would have used this
    assert float(emb.embed_scale) == pytest.approx(64 ** 0.5)
    assert wrapped.config is model.config and wrapped.lm_head is model.lm_head
