"""The polish stage of train_target.py (``--polish FROM``), on the CPU.

The stage itself trains on a GPU; what can be checked here is what it builds on: the rate it
follows, the checkpoint it refuses, and that a saved bf16 target loads back as the same weights
with the same expert kernel the first stage trained with.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import types
from pathlib import Path

import pytest

GPU_DIR = Path(__file__).resolve().parents[1] / "gpu"
sys.path.insert(0, str(GPU_DIR))

import train_target as tt  # noqa: E402

CORPUS = {"sha256": "c0" * 32}


def test_the_first_stage_keeps_a_constant_rate_and_the_polish_decays_to_its_floor():
    first = tt.TrainConfig()
    assert {tt.seq_lr_at(s, first) for s in (0, 7, first.seq_steps - 1)} == {first.seq_lr}
    polish = dataclasses.replace(tt.TrainConfig(), **tt.POLISH)
    rates = [tt.seq_lr_at(s, polish) for s in range(polish.seq_steps)]
    assert rates[0] == pytest.approx(polish.seq_lr)
    assert rates[-1] == pytest.approx(polish.seq_lr_floor)
    assert all(a > b for a, b in zip(rates, rates[1:]))


def test_the_polish_recipe_decodes_the_length_the_gate_judges_and_draws_windows_of_its_own():
    polish = dataclasses.replace(tt.TrainConfig(), **tt.POLISH)  # every key is a TrainConfig field
    assert polish.steps == 0, "the polish adds no token-level steps"
    assert polish.seq_new == tt.MAX_TOKENS
    assert polish.seq_seed_offset != tt.TrainConfig().seq_seed_offset


def _folder(tmp_path: Path, corpus_sha: str = CORPUS["sha256"]) -> Path:
    folder = tmp_path / "models" / tt.TARGET.name
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"weights")
    (folder / "config.json").write_text("{}")
    record = {"target_sha256": tt.checkpoint_sha256(folder), "corpus": {"sha256": corpus_sha},
              "train_config": {"steps": 1000}, "greedy_probe": {"looping_sequences": 4}, "gpu": "H200"}
    (folder / "train-record.json").write_text(json.dumps(record))
    return folder


def test_polish_source_names_the_checkpoint_it_starts_from(tmp_path):
    folder = _folder(tmp_path)
    source = tt.polish_source(folder, tmp_path / "polished", CORPUS)
    assert source["target_sha256"] == tt.checkpoint_sha256(folder)
    assert source["greedy_probe"] == {"looping_sequences": 4}
    assert source["recipe"] == tt.POLISH
    with pytest.raises(SystemExit, match="builds on a polished target"):
        tt.polish_source(folder, tmp_path / "polished", CORPUS, tt.POLISH_LONG)
    record = json.loads((folder / "train-record.json").read_text())
    (folder / "train-record.json").write_text(json.dumps({**record, "polished_from": {"target_sha256": "f1"}}))
    assert tt.polish_source(folder, tmp_path / "polished", CORPUS, tt.POLISH_LONG)["recipe"] == tt.POLISH_LONG


def test_polish_source_refuses_weights_that_are_not_their_records(tmp_path):
    folder = _folder(tmp_path)
    (folder / "model.safetensors").write_bytes(b"weightz")
    with pytest.raises(SystemExit, match="not its train record's"):
        tt.polish_source(folder, tmp_path / "polished", CORPUS)


def test_polish_source_refuses_another_corpus_a_missing_record_and_its_own_folder(tmp_path):
    folder = _folder(tmp_path, corpus_sha="ff" * 32)
    with pytest.raises(SystemExit, match="trained on corpus ff"):
        tt.polish_source(folder, tmp_path / "polished", CORPUS)
    with pytest.raises(SystemExit, match="would overwrite it"):
        tt.polish_source(folder, folder.parent, {"sha256": "ff" * 32})
    (folder / "train-record.json").unlink()
    with pytest.raises(SystemExit, match="no train-record.json"):
        tt.polish_source(folder, tmp_path / "polished", CORPUS)


def test_a_saved_bf16_target_loads_back_as_the_same_weights_with_the_expert_kernel(tmp_path):
    torch = pytest.importorskip("torch", reason="the launcher venv installs CPU torch for these tests")
    pytest.importorskip("transformers")
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration

    import make_checkpoints as mc

    shape = mc.TargetShape("polish-test", 2, top_k_experts=2, hidden_size=64, num_attention_heads=2,
                           num_key_value_heads=1, num_global_key_value_heads=1, num_experts=4,
                           moe_intermediate_size=32, intermediate_size=64, sliding_window=16)
    cfg = mc.gemma4_config_dict(shape, vocab=512, max_positions=512)
    config = Gemma4Config(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")})
    config.architectures = ["Gemma4ForConditionalGeneration"]
    torch.manual_seed(0)
    model = Gemma4ForConditionalGeneration._from_config(config, attn_implementation="eager", dtype=torch.float32)
    model.to(torch.bfloat16).save_pretrained(tmp_path / "t", safe_serialization=True)
    loaded = tt.load_model(tmp_path / "t", "cpu")
    saved = {k: v.float() for k, v in model.state_dict().items()}
    got = loaded.state_dict()
    assert set(got) == set(saved)
    assert all(got[k].dtype == torch.float32 for k in got)
    assert all(torch.equal(got[k], saved[k]) for k in saved)
    experts = loaded.model.language_model.layers[0].experts
    assert isinstance(experts.forward, types.MethodType) and experts.forward.__func__ is tt._experts_forward


def _diverse(n: int, seed: int = 3) -> list[int]:
    import random

    rng = random.Random(seed)
    return [rng.randrange(1000, 60000) for _ in range(n)]


def test_loop_mask_marks_a_run_of_one_token_once_it_is_min_match_long():
    tokens = _diverse(20) + [7] * 30
    mask = tt.loop_mask(tokens, 20, 32, 8)
    # the first copy repeats nothing, copies 2..9 make a run of 1..8: the 9th copy is the first marked
    assert mask == [False] * 8 + [True] * 22


def test_loop_mask_needs_a_full_period_of_repetition_for_long_periods():
    block = _diverse(20, seed=5)
    tokens = _diverse(10) + block * 3
    mask = tt.loop_mask(tokens, 10, 32, 8)
    # period 20: marked from the 20th token of the second copy on (a whole block repeated)
    assert mask.index(True) == 20 + 19
    assert all(mask[39:])


def test_loop_mask_leaves_periods_above_the_gates_and_diverse_text_alone():
    block = _diverse(33, seed=6)
    assert not any(tt.loop_mask(_diverse(5) + block * 3, 5, 32, 8))
    assert not any(tt.loop_mask(_diverse(300, seed=8), 0, 32, 8))


def test_loop_mask_sees_a_loop_that_began_in_the_prompt():
    tokens = _diverse(10) + [1, 2, 3] * 10 + [1, 2, 3]
    mask = tt.loop_mask(tokens, 40, 32, 8)
    assert mask == [True] * 3


def test_every_sequence_the_gate_calls_looping_ends_on_a_marked_token():
    import random

    import gate

    rng = random.Random(11)
    checked = 0
    for _ in range(300):
        period = rng.randrange(1, 40)
        block = [rng.randrange(0, 50) for _ in range(period)]  # small alphabet: near-loops too
        tail = (block * (200 // period + 1))[:rng.randrange(0, 120)]
        tokens = [rng.randrange(0, 50) for _ in range(rng.randrange(60, 140))] + tail
        if gate.looping(tokens):
            checked += 1
            assert tt.loop_mask(tokens, 0, 32, 8)[-1], (period, len(tail))
    assert checked >= 50


def test_the_long_polishes_draw_the_gates_prompt_lengths_and_are_watched_on_them():
    for name in ("long", "long-heavy"):
        cfg = dataclasses.replace(tt.TrainConfig(), **tt.POLISH_RECIPES[name])  # every key a field
        assert cfg.steps == 0 and cfg.seq_new == tt.MAX_TOKENS and cfg.seq_mask == "loop"
        prefixes = [tt.seq_prefix_at(s, cfg) for s in range(cfg.seq_steps)]
        assert sorted(set(prefixes)) == sorted(cfg.seq_prefix_cycle) and prefixes[:2] == [128, 384]
        assert max(cfg.seq_prefix_cycle) + cfg.seq_new <= tt.MAX_POSITIONS
        assert max(cfg.validation_lengths) >= 1400 > max(tt.TrainConfig().validation_lengths)
        assert cfg.seq_seed_offset not in (tt.POLISH["seq_seed_offset"], tt.TrainConfig().seq_seed_offset)
    assert tt.POLISH_RECIPES["long-heavy"]["seq_weight"] == 2 * tt.POLISH_RECIPES["long"]["seq_weight"]
    assert tt.POLISH_RECIPES["polish"] is tt.POLISH
    first = tt.TrainConfig()
    assert [tt.seq_prefix_at(s, first) for s in (0, 5)] == [first.seq_prefix] * 2


class _Words:
    """A tokenizer stand-in: a text's ids are its words' lengths."""

    def encode_batch(self, texts, add_special_tokens=False):
        return [types.SimpleNamespace(ids=[len(w) for w in t.split()]) for t in texts]


def _heldout(n=60):
    import random

    rng = random.Random(4)
    return [(f"f{i}.py", " ".join("x" * rng.randrange(1, 9) for _ in range(rng.randrange(50, 1800))))
            for i in range(n)]


def test_validation_prompts_of_one_length_are_the_ones_the_first_stage_was_watched_on():
    """The defaults pick what the single-length selection always picked (files of 200 tokens or
    more, shuffled with the seed + 3, the first 32), so the first stage's records do not change."""
    import random

    heldout, taken = _heldout(), {"f3.py", "f7.py"}
    got = tt.validation_prompts(_Words(), heldout, taken, 20261126)
    docs = [(p, [len(w) for w in t.split()]) for p, t in heldout if p not in taken]
    long_docs = [d for d in docs if len(d[1]) >= 200]
    random.Random(20261126 + 3).shuffle(long_docs)
    bos = tt.lm_files.CONFIG_IDS["bos_token_id"]
    assert [p["token_ids"] for p in got] == [[bos] + ids[:199] for _, ids in long_docs[:32]]
    assert [p["source"] for p in got] == [path for path, _ in long_docs[:32]]


def test_validation_prompts_take_their_lengths_in_turn_from_distinct_files_the_proof_does_not_use():
    heldout, taken = _heldout(), {"f1.py"}
    got = tt.validation_prompts(_Words(), heldout, taken, 5, count=12, lengths=(200, 1400))
    long_files = sum(1 for p, t in heldout if p not in taken and len(t.split()) >= 1400)
    assert [len(p["token_ids"]) for p in got[:2]] == [200, 1400]
    assert sum(len(p["token_ids"]) == 1400 for p in got) == min(6, long_files) and long_files > 0
    sources = [p["source"] for p in got]
    assert len(set(sources)) == len(sources) and "f1.py" not in sources


def test_the_longest_validation_prompts_take_the_scarce_long_files_first(capsys):
    """Few files are 1,400 tokens long: the 1,400-token prompts get them before the 200-token ones
    take any, and a length left short is said."""
    heldout = [(f"long{i}.py", " ".join(["ab"] * 1500)) for i in range(3)]
    heldout += [(f"short{i}.py", " ".join(["ab"] * 300)) for i in range(10)]
    got = tt.validation_prompts(_Words(), heldout, set(), 1, count=8, lengths=(200, 1400))
    assert sorted(p["source"] for p in got if len(p["token_ids"]) == 1400) == ["long0.py", "long1.py", "long2.py"]
    assert [len(p["token_ids"]) for p in got[:2]] == [200, 1400] and len(got) == 7
    assert "7 of 8; too few held-out files of [1400] tokens" in capsys.readouterr().out


def test_a_second_polish_recipe_needs_the_polish_it_builds_on():
    with pytest.raises(SystemExit):
        tt.main(["/tmp/nowhere", "--polish-recipe", "long"])


def _tiny_target(torch):
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration

    import make_checkpoints as mc

    shape = mc.TargetShape("chunk-test", 2, top_k_experts=2, hidden_size=64, num_attention_heads=2,
                           num_key_value_heads=1, num_global_key_value_heads=1, num_experts=4,
                           moe_intermediate_size=32, intermediate_size=64, sliding_window=16)
    cfg = mc.gemma4_config_dict(shape, vocab=512, max_positions=512)
    config = Gemma4Config(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")})
    torch.manual_seed(0)
    model = Gemma4ForConditionalGeneration._from_config(config, attn_implementation="eager", dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():  # logits that differ from token to token, and some repeats
            if p.dim() >= 2:
                p.normal_(0.0, 0.3)
    for layer in model.model.language_model.layers:
        layer.experts.forward = types.MethodType(tt._experts_forward, layer.experts)
    return model


def test_the_sequence_loss_in_row_chunks_gives_the_gradient_of_one_batch():
    torch = pytest.importorskip("torch", reason="the launcher venv installs CPU torch for these tests")
    pytest.importorskip("transformers")
    model = _tiny_target(torch)
    prefixes = torch.tensor([[2] + [(7 * r + 13 * i) % 500 + 3 for i in range(11)] for r in range(4)])
    one = dataclasses.replace(tt.TrainConfig(), seq_new=24)
    # 4 rows of 36 tokens: 5,184; a budget of 2,600 takes 2 rows a forward
    chunked = dataclasses.replace(one, seq_rows_len2=2600)
    assert tt.seq_chunk_rows(4, 36, one) == 4 and tt.seq_chunk_rows(4, 36, chunked) == 2
    assert tt.seq_chunk_rows(32, 1408, tt.TrainConfig()) == 2  # the long polish's longest prefixes
    assert tt.seq_chunk_rows(32, 256, tt.TrainConfig()) == 32  # the first polish: one chunk, as before

    grads, losses = [], []
    for cfg in (one, chunked):
        model.zero_grad(set_to_none=True)
        loss, share, done = tt.sequence_unlikelihood_loss(model, prefixes, cfg)
        assert done is (cfg is chunked)
        if not done:
            loss.backward()
        assert share > 0  # some continuation tokens are penalised: the gradient says something
        losses.append(float(loss.detach()))
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    assert grads[0].abs().sum() > 0 and grads[0].shape == grads[1].shape
    assert losses[1] == pytest.approx(losses[0], rel=1e-3)
    # bf16 autocast rounds a batch of 2 rows apart from one of 4; a chunk divided by its own
    # tokens (not the step's) would be off by a factor of 2
    assert float((grads[1] - grads[0]).norm() / grads[0].norm()) < 1e-2
