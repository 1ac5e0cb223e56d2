"""walk_along.py (issue 25, item 4): the reference walk along a run's own output, on a small
random Gemma 4 target of the trained target's make and a random drafter, on the CPU. Nothing here
needs a GPU; the released vLLM does not run (the walk is the reference side only)."""

from __future__ import annotations

import json
import random

import pytest

from tests.unit.gpu_scripts import load as _load
from tests.unit.gpu_scripts import tiny_gemma4_target

torch = pytest.importorskip("torch", reason="the walk needs torch (the test venv has the CPU build)")
ref = _load("dflash_reference")
td = _load("train_drafter")
wa = _load("walk_along")
rs = _load("realshape")
ar = _load("acceptance_report")

K = 4
DRAFTER = {
    "hidden_size": 64, "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
    "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 6,
    "dflash_config": {"mask_token_id": 4, "target_layer_ids": [1, 2]},
}


@pytest.fixture(scope="module")
def pieces():
    model, cfg = tiny_gemma4_target(4)
    torch.manual_seed(7)
    drafter = ref.Drafter(ref.Geometry.from_config(DRAFTER))
    drafter.init_weights(0.3)
    drafter.eval()
    shared = ref.Shared.gemma4(model.model.language_model.embed_tokens.weight.detach(), cfg["text_config"])
    rng = random.Random(3)
    prompt = [2] + [rng.randrange(24, 256) for _ in range(11)]
    return model, drafter, shared, prompt


def test_along_the_targets_own_greedy_text_the_walk_is_the_offline_walk(pieces):
    """evaluate()'s walk checks drafts against the teacher-forced argmax of a continuation K tokens
    longer than the request; along the target's own greedy text that argmax is the text, and the
    walk along it extends the text by the same K tokens, so both count the same steps (the last
    one's drafts past max_tokens included, as vLLM's counters do)."""
    model, drafter, shared, prompt = pieces
    max_tokens = 24
    cont = td.greedy_continue(model, [prompt], max_tokens + K)[0]
    seq = prompt + cont
    feats, greedy, _ = td.target_features(model, [seq], [1, 2], 1000)
    # greedy[t] is the token for t + 1: over the continuation it is the continuation (float32)
    assert greedy[0, len(prompt) - 1:-1].tolist() == cont
    for sem in ref.SEMANTICS:
        drafts = td.drafts_at_every_anchor(drafter, shared, feats[0], torch.tensor(seq), len(prompt), max_tokens,
                                           sem, K)
        offline = td.prompt_steps(drafts, greedy[0], len(prompt), max_tokens, K)
        assert wa.steps_along(model, drafter, shared, prompt, cont[:max_tokens], sem, K, 1000) == offline


def test_drafts_count_against_the_text_the_run_wrote_not_the_targets_argmax(pieces):
    """A text whose first tokens are the drafter's own first block: that step accepts all K drafts
    whatever the target would have said; the same text with one drafted token changed accepts
    only the drafts before it."""
    model, drafter, shared, prompt = pieces
    sem = ref.SEMANTICS[0]
    bonus = 40
    feats, _, _ = td.target_features(model, [prompt + [bonus]], [1, 2], 1000)
    first = td.drafts_at_every_anchor(drafter, shared, feats[0], torch.tensor(prompt + [bonus]), len(prompt), 1,
                                      sem, K)[0].tolist()
    text = [bonus] + first + [50] * 12
    assert wa.steps_along(model, drafter, shared, prompt, text, sem, K, 1000)[0] == K
    changed = [bonus] + first[:2] + [(first[2] + 1) % 256] + first[3:] + [50] * 12
    assert wa.steps_along(model, drafter, shared, prompt, changed, sem, K, 1000)[0] == 2


def test_the_last_step_counts_drafts_past_the_end_as_vllms_counters_do(pieces, monkeypatch):
    """An oracle drafter (each block drafts the K tokens that follow its anchor in the text it is
    given) accepts every draft; the request's last step too, past max_tokens, because the text
    goes on with the target's own greedy tokens (vLLM counts a step's accepted drafts before it
    cuts the output). Cut at the run's last token instead, that step would accept fewer."""
    model, drafter, shared, prompt = pieces

    def oracle(_drafter, _shared, _features, tokens, plen, n, _semantics, k):
        ahead = [tokens[a + 1:a + 1 + k] for a in range(plen, plen + n)]
        return torch.stack([torch.nn.functional.pad(t, (0, k - len(t)), value=-1) for t in ahead])

    monkeypatch.setattr(wa.train_drafter, "drafts_at_every_anchor", oracle)
    output = td.greedy_continue(model, [prompt], 23)[0]
    steps = wa.steps_along(model, drafter, shared, prompt, output, ref.SEMANTICS[0], K, 1000)
    # n: 1, 6, 11, 16, 21, then 26 >= 23: five steps, the last one's drafts partly past the end
    assert steps == [K] * 5


def _drafter_folder(path, tag: bytes):
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    (path / "model.safetensors").write_bytes(tag)
    return td.drafter_sha256(path)


def test_only_trained_drafter_runs_that_generated_are_walked_and_another_drafters_is_refused(tmp_path):
    models = tmp_path / "models"
    here = _drafter_folder(models / rs.TRAINED_DRAFTER_TRAINED, b"mine")
    runs = {
        "trained-dflash-trained-fa2-cg-bf16-capture": {"drafter_sha256": here, "groups": {"1": [{}]}},
        "trained-ref-bf16": {"passes": [[]]},                                      # a reference: no drafter
        "trained-speed-dflash-trained-fa2-cg-bf16": {"drafter_sha256": here, "groups": {"1": [{}]}},  # speed
        "trained-dflash-fa2-cg-bf16": {"groups": {"1": [{}]}},                     # the random drafter
    }
    paths = []
    for name, raw in runs.items():
        assert name in rs.RUNS, name
        paths.append(tmp_path / f"{name}.raw.json")
        paths[-1].write_text(json.dumps({"name": name, **raw}))
    assert [p for p, _ in wa.walked_runs(paths, models)] == [paths[0]]
    other = tmp_path / "other.raw.json"
    other.write_text(json.dumps({"name": "trained-dflash-trained-fa2-cg-bf16-capture",
                                 "drafter_sha256": "0" * 64, "groups": {"1": [{}]}}))
    with pytest.raises(SystemExit, match="drafter 00000000, but .* holds"):
        wa.walked_runs([other], models)
    # Found in a folder beside this drafter's runs, it is left out, not walked.
    assert [p for p, _ in wa.walked_runs([other, paths[0]], models, named=set())] == [paths[0]]


def test_each_model_loads_once_and_each_text_is_walked_once_across_runs(tmp_path, monkeypatch):
    """An ablation under exact numerics writes its patched run's text: the second run reuses the
    first's steps, and both runs share one loaded target (stand-ins count the loads and walks;
    the walk itself is checked above)."""
    loads, walks = [], []
    monkeypatch.setattr(wa.train_drafter, "load_target", lambda d, dev: loads.append(dev) or object())
    monkeypatch.setattr(wa.train_drafter, "load_drafter", lambda d, dev: object())
    monkeypatch.setattr(wa.train_drafter, "shared_from_target", lambda m, d: object())
    monkeypatch.setattr(wa, "steps_along", lambda *a: walks.append(a[3:5]) or [len(a[4]) % 3])
    (tmp_path / rs.TRAINED_TARGET).mkdir()
    (tmp_path / rs.TRAINED_TARGET / "prompts.json").write_text(json.dumps([{"token_ids": [2, i]} for i in range(3)]))
    outs = [{"token_ids": [5, 6]}, {"token_ids": [7]}]
    raw = {"name": "trained-dflash-trained-fa2-cg-bf16-capture-bi-noinductor", "vllm_version": "0.21.0",
           "groups": {"1": outs[:1], "2": outs}}
    walker = wa.Walker(tmp_path, "cpu", k=2)
    first = walker.run(raw)
    ablation = walker.run(dict(raw, name="trained-dflash-trained-fa2-cg-bf16-capture-bi-noinductor-without-"
                                         "gemma4-dflash-embed-scale-logit-softcap"))
    assert len(loads) == 1 and len(walks) == 2  # prompt 0's text in both groups, then prompt 1's
    assert first["steps"] == ablation["steps"] == 3 and first["distinct_texts"] == 2 and first["requests"] == 3


def test_nvfp4_runs_are_walked_on_the_nvfp4_target_of_their_numerics():
    assert wa.run_numerics({"name": "trained-dflash-trained-fa2-cg-bf16-capture"}) == "bf16"
    marlin = {"name": "trained-dflash-trained-fa2-cg-nvfp4",
              "log_text_for_backends": ["Using MarlinNvFp4LinearKernel for NVFP4 GEMM"]}
    assert rs.nvfp4_numerics(marlin) == "W4A16" and wa.run_numerics(marlin) == "W4A16"
    assert wa.run_numerics({"name": "trained-dflash-trained-fa2-cg-nvfp4-bi-noinductor",
                            "log_text_for_backends": []}) == "W4A4"


def _record(measured: float, reference: float, along: float | None) -> dict:
    rec = {"name": "trained-dflash-trained-fa2-cg-bf16-capture-bi-noinductor", "vllm": "0.21.0", "series": "s",
           "quantization": "bf16", "drafter_sha256": "d", "acceptance": {"mean_acceptance_length": measured},
           "acceptance_reference": {"mean_acceptance_length": reference}}
    if along is not None:
        rec["acceptance_along_output"] = {"mean_acceptance_length": along}
    return rec


def test_the_acceptance_bar_reads_the_independent_reference_and_the_walk_along_the_output_stands_beside():
    # The HF-text walk 14 % above, the walk along the run's own text 3 % below: the bar (the
    # independent reference, issue 51) is not met; the walk along its output is shown beside.
    row = ar._row(_record(3.53, 4.09, 3.42), None, [])
    assert not row["acceptance_bar_met"] and row["acceptance_bar_reference"] == "reference"
    assert row["acceptance_bar_met_along_output"] is True
    assert row["relative_gap"] == 0.1369 and row["relative_gap_along_output"] == 0.0322
    # Close to the HF-text walk but 15 % off its own text: met, with the walk beside it not met.
    close = ar._row(_record(4.0, 4.05, 3.47), None, [])
    assert close["acceptance_bar_met"] and close["acceptance_bar_met_along_output"] is False
    # Without the walk along its output: nothing beside it.
    before = ar._row(_record(3.53, 4.09, None), None, [])
    assert not before["acceptance_bar_met"] and before["acceptance_bar_met_along_output"] is None
    # Under 3 fails whatever the references say.
    assert not ar._row(_record(2.9, 2.9, 2.9), None, [])["acceptance_bar_met"]


def test_realshape_records_the_walk_along_the_output_and_its_ratio():
    raw = {"drafter_sha256": "d", "acceptance_reference": {"mean_acceptance_length": 4.0},
           "acceptance_along_output": {"mean_acceptance_length": 3.5, "steps": 9}}
    fields = rs.drafter_fields(raw, {"mean_acceptance_length": 3.5})
    assert fields["acceptance_along_output"]["steps"] == 9
    assert fields["acceptance_ratio_along_output"] == 1.0 and fields["acceptance_ratio_to_reference"] == 0.875
    assert rs.drafter_fields({"drafter_sha256": "d"}, None)["acceptance_ratio_along_output"] is None
