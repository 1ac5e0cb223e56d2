"""tests/gpu/judging/conformance.py: the verdict of a served drafter against z-lab's loop (pure parts)."""

from __future__ import annotations

import pytest

from tests.unit.gpu_scripts import load

conf = load("conformance")


def test_the_noise_bound_is_a_percentile_of_the_moves_never_the_largest():
    moves = [0.01] * 99 + [5.0]
    assert conf.percentile(moves, 99) == 0.01  # one wide move does not set the bound
    assert conf.percentile(moves, 100) == 5.0
    with pytest.raises(ValueError):
        conf.percentile([], 99)


def test_margin_moves_stop_where_the_two_texts_part():
    z = [{"token_ids": [1, 2, 3, 4], "margins": [1.0, 2.0, 3.0, 4.0]}]
    t = [{"token_ids": [1, 2, 9, 4], "margins": [1.5, 1.0, 0.0, 0.0]}]
    assert conf.margin_moves(z, t) == [0.5, 1.0]


def test_the_common_prefix_ends_at_the_first_margin_under_the_bound():
    assert conf.common_prefix([3.0, 2.0, 0.1, 5.0], 0.5) == 2
    assert conf.common_prefix([3.0, 2.0], 0.5) == 2


def test_z_lab_steps_over_a_prefix_count_a_crossing_step_with_its_tokens_inside():
    # token 0 from prefill; steps produce 3, 1, 5 tokens: tokens 1-3, 4, 5-9
    assert conf.zlab_prefix_steps([3, 1, 5], 10) == (9, 3)
    assert conf.zlab_prefix_steps([3, 1, 5], 6) == (5, 3)  # the third step is cut after 1 token
    assert conf.zlab_prefix_steps([3, 1, 5], 4) == (3, 1)
    assert conf.zlab_prefix_steps([3, 1, 5], 1) == (0, 0)  # the prefill token alone: no step


def _zlab(rows):
    return {"rows": rows, "passes_identical": True, "gate": {"passes": True},
            "acceptance": {"steps_none_accepted": 1}}


def test_a_served_release_holds_only_with_identical_prefixes_and_acceptance_within_5_percent(monkeypatch):
    monkeypatch.setattr(conf.bars, "get", lambda s, k: {"margin_move_percentile": 99, "min_prompts": 2}[k])
    z = [{"token_ids": [5, 6, 7, 8, 9], "margins": [2.0, 2.0, 2.0, 2.0, 2.0], "acceptance_lengths": [1, 3]},
         {"token_ids": [5, 6, 7, 8, 9], "margins": [2.0, 2.0, 2.0, 2.0, 2.0], "acceptance_lengths": [2, 2]}]
    twin = {"rows": [{"token_ids": r["token_ids"], "margins": [1.9] * 5} for r in z]}

    def served(accepted, tokens=(5, 6, 7, 8, 9)):
        return {"vllm": "0.33.0", "series": "s", "rows": [
            {"token_ids": list(tokens), "acceptance": {"drafts": 2, "accepted_tokens": accepted,
                                                      "mean_acceptance_length": 1 + accepted / 2}}] * 2}

    good = conf.judge(_zlab(z), twin, served(2))
    assert good["outputs_identical"] and good["acceptance"]["zlab_acceptance"] == 2.0
    assert good["acceptance"]["vllm_acceptance"] == 2.0 and good["holds"]
    far = conf.judge(_zlab(z), twin, served(3))  # 2.5 against 2.0: 25 % off
    assert far["acceptance"]["within"] is False and not far["holds"]
    wrong = conf.judge(_zlab(z), twin, served(2, tokens=(5, 6, 0, 8, 9)))
    assert wrong["identical_over_prefix"] == 0 and wrong["rows"][0]["first_difference"] == 2 and not wrong["holds"]
    no_teeth = conf.judge({**_zlab(z), "passes_identical": False}, twin, served(2))
    assert no_teeth["teeth"]["zlab_reproduces"] is False and not no_teeth["holds"]


def test_a_prefix_shorter_than_the_output_takes_the_request_stopped_there(monkeypatch):
    monkeypatch.setattr(conf.bars, "get", lambda s, k: 50)
    z = {"token_ids": [5, 6, 7, 8, 9], "margins": [2.0, 2.0, 2.0, 0.0, 2.0], "acceptance_lengths": [2, 2]}
    s = {"token_ids": [5, 6, 7, 1, 1], "acceptance": {"drafts": 9, "accepted_tokens": 0, "mean_acceptance_length": 1.0},
         "prefix_acceptance": {"drafts": 1, "accepted_tokens": 1, "mean_acceptance_length": 2.0}}
    row = conf.compare_prompt(z, s, bound=0.5)
    assert row["prefix"] == 3 and row["identical_over_prefix"]
    assert (row["zlab_tokens"], row["zlab_steps"]) == (2, 1) and row["vllm_acceptance"] == 2.0


def test_lossless_is_strict_token_identity_with_the_twin_and_a_missing_row_is_not_identical():
    twin = [{"token_ids": [1, 2, 3]}, {"token_ids": [4, 5, 6]}]
    assert conf.identical_rows([{"token_ids": [1, 2, 3]}, {"token_ids": [4, 5, 6]}], twin)["holds"]
    one_off = conf.identical_rows([{"token_ids": [1, 2, 3]}, {"token_ids": [4, 5, 7]}], twin)
    assert (one_off["identical"], one_off["holds"], one_off["first_differing"]) == (1, False, 1)
    failed = conf.identical_rows([{"token_ids": [1, 2, 3]}, {"error": "skipped: deadline"}], twin)
    assert failed["identical"] == 1 and not failed["holds"]
    assert conf.identical_rows(None, twin) == {"identical": 0, "of": 2, "holds": False, "first_differing": None}


def test_the_window_binds_once_a_block_reaches_past_the_window():
    # window 8, blocks of 4: a block starting at c binds when c + 3 >= 8. Prompt of 3 tokens: the
    # first block starts at 3 (the prefill's token), then 3 + 2 = 5, then 5 + 1 = 6.
    zlab = {"block_size": 4, "rows": [{"acceptance_lengths": [2, 1, 3]}, {"acceptance_lengths": [1]}]}
    served = {"rows": [{"prompt_tokens": 3}, {"prompt_tokens": 20}]}
    w = conf.window_binding(zlab, served, 8)
    assert (w["steps"], w["binding"]) == (4, 3) and w["share"] == 0.75  # 5 and 6 bind, 3 not; the long prompt
    assert conf.window_binding(zlab, served, None) is None  # no sliding layer
    assert conf.window_binding(zlab, {"rows": [{}, {"prompt_tokens": 3}]}, 8) is None  # lengths not recorded


def test_twins_of_one_release_must_agree_and_a_release_with_one_twin_is_not_listed():
    a = {"vllm": "0.21.0", "rows": [{"token_ids": [1, 2]}, {"token_ids": [3, 4]}]}
    b = {"vllm": "0.21.0", "rows": [{"token_ids": [1, 2]}, {"token_ids": [3, 9]}]}
    c = {"vllm": "0.33.0", "rows": [{"token_ids": [1, 2]}]}
    got = conf.twins_reproduce([a, b, c])
    assert list(got) == ["0.21.0"] and got["0.21.0"]["identical"] == 1 and not got["0.21.0"]["holds"]


def _write(path, doc):
    import json

    path.write_text(json.dumps(doc))
    return str(path)


def test_a_served_record_without_its_prefix_runs_is_not_measured_not_a_miss(monkeypatch):
    """A server started before z-lab's record existed serves every prompt whole: where a prefix
    ends inside the output, the pooled prefix acceptance has nothing to compare (never a pass)."""
    monkeypatch.setattr(conf.bars, "get", lambda s, k: {"margin_move_percentile": 50, "min_prompts": 2}[k])
    z = [{"token_ids": [5, 6, 7, 8, 9], "margins": [2.0, 2.0, 2.0, 0.0, 2.0], "acceptance_lengths": [2, 2]}] * 2
    twin = {"rows": [{"token_ids": [5, 6, 7, 8, 9], "margins": [1.5, 1.5, 1.5, 0.5, 1.5]}] * 2}
    acc = {"drafts": 1, "accepted_tokens": 1, "mean_acceptance_length": 2.0}
    whole = {"vllm": "0.33.0", "series": "s", "rows": [{"token_ids": [5, 6, 7, 1, 1], "acceptance": acc}] * 2}
    v = conf.judge(_zlab(z), twin, whole)
    assert v["prefix_runs"] == {"needed": 2, "made": 0} and not v["holds"]
    cells = conf._prefix_cells(v)
    assert cells == ("not measured", "0 of the 2 prefix runs in the served record")
    assert conf._verdict_mark(v) == "not measured"
    stopped = {**whole, "rows": [{**whole["rows"][0], "prefix_acceptance": acc}] * 2}
    v = conf.judge(_zlab(z), twin, stopped)
    assert v["prefix_runs"] == {"needed": 2, "made": 2} and conf._prefix_cells(v)[0] == "holds" and v["holds"]
    # one run skipped at the deadline (served.py leaves its acceptance None), one made: the
    # verdict is not judged on the prompt that remains
    partial = {**whole, "rows": [{**whole["rows"][0], "prefix_acceptance": None}, stopped["rows"][1]]}
    v = conf.judge(_zlab(z), twin, partial)
    assert v["prefix_runs"] == {"needed": 2, "made": 1} and not v["holds"] and not v["holds_whole_steps"]
    assert conf._prefix_cells(v) == ("not measured", "1 of the 2 prefix runs in the served record")
    # an earlier record without the field was measured whole, as its verdict says
    legacy = {k: val for k, val in v.items() if k != "prefix_runs"}
    assert conf.verdict({**legacy, "holds": True}) == "holds" and conf.verdict(legacy) == "misses"


def test_the_report_judges_releases_each_against_its_own_twin_and_a_variant_only_beside_them(tmp_path, monkeypatch):
    toks = [[5, 6, 7, 8, 9 + i] for i in range(2)]
    z = {**_zlab([{"token_ids": t, "margins": [2.0] * 5, "acceptance_lengths": [2, 2]} for t in toks]),
         "oracle": "dflash 0.1.0", "deviation": "normalizer", "target_sha256": "t", "drafter_sha256": "d",
         "block_size": 4}
    twin = {"vllm": "0.21.0", "series": "s", "rows": [{"token_ids": t, "margins": [1.9] * 5} for t in toks]}
    acc = {"drafts": 2, "accepted_tokens": 2, "mean_acceptance_length": 2.0}
    good = {"vllm": "0.21.0", "series": "s", "numerics": "exact", "drafter_window": 8,
            "rows": [{"token_ids": t, "acceptance": acc, "prompt_tokens": 3} for t in toks],
            "batched_rows": [{"token_ids": t} for t in toks]}
    without = {**good, "variant": "without dflash-drafter-per-layer-attention",
               "rows": [{"token_ids": t, "acceptance": {**acc, "accepted_tokens": 0}, "prompt_tokens": 3} for t in toks]}
    monkeypatch.setattr(conf.bars, "get", lambda s, k: {"margin_move_percentile": 99, "min_prompts": 2}[k])
    args = ["--zlab", _write(tmp_path / "z.json", z), "--out", str(tmp_path / "out")]
    t = _write(tmp_path / "t.json", twin)
    assert conf.main([*args, "--twin", t, "--served", _write(tmp_path / "g.json", good),
                      "--served", _write(tmp_path / "w.json", without)]) == 0  # written; the variant misses
    import json

    doc = json.loads((tmp_path / "out" / "conformance.json").read_text())
    g, w = doc["releases"]
    assert g["holds"] and g["lossless_one_at_a_time"]["holds"] and g["lossless_batched"]["holds"]
    assert not w["holds"] and w["label"] == "0.21.0 (without dflash-drafter-per-layer-attention)"
    assert (g["served_acceptance"]["mean_acceptance_length"], w["served_acceptance"]["mean_acceptance_length"]) == (2.0, 1.0)
    assert g["window_binding"]["window"] == 8
    md = (tmp_path / "out" / "conformance.md").read_text()
    assert "| 0.21.0 (without dflash-drafter-per-layer-attention) |" in md and "all in flight" in md
    with pytest.raises(SystemExit):  # two twins for three served records
        conf.main([*args, "--twin", t, "--twin", t, "--served", t, "--served", t, "--served", t])


def test_the_crossing_step_counted_whole_stands_beside_the_truncated_verdict(monkeypatch):
    # Prefix 4: need 3 tokens after the prefill's; z-lab's steps give 2 then 5 (the second crosses).
    z = {"token_ids": [5, 6, 7, 8, 9, 10, 11, 12], "margins": [2.0, 2.0, 2.0, 2.0, 0.0, 2.0, 2.0, 2.0],
         "acceptance_lengths": [2, 5]}
    # vLLM stopped at the prefix counts what its second step accepted past the stop: 2 drafts, 5 accepted
    s = {"token_ids": z["token_ids"], "prefix_acceptance": {"drafts": 2, "accepted_tokens": 5,
                                                           "mean_acceptance_length": 3.5}}
    row = conf.compare_prompt(z, s, bound=0.5)
    assert (row["prefix"], row["zlab_tokens"], row["zlab_steps"]) == (4, 3, 2)
    assert row["zlab_tokens_whole_steps"] == 7 and row["same_steps"]
    pool = conf.pooled([row])
    assert pool["zlab_acceptance"] == 1.5 and pool["vllm_acceptance"] == 3.5 and pool["within"] is False
    assert pool["zlab_acceptance_whole_steps"] == 3.5 and pool["within_whole_steps"] is True
    assert pool["prompts_same_steps"] == 1 and pool["zlab_steps"] == 2
    # Both sides cut at the prefix: vLLM's 3 tokens after the prefill's over its 2 steps, as z-lab's
    assert row["vllm_tokens_cut"] == 3
    assert pool["vllm_acceptance_cut"] == 1.5 and pool["gap_cut_both"] == 0.0 and pool["within_cut_both"] is True


def test_both_sides_cut_at_the_prefix_misses_when_vllm_needs_more_steps():
    # The same prefix, but vLLM took 3 verify steps for the 3 tokens z-lab produced in 2
    z = {"token_ids": [5, 6, 7, 8, 9, 10, 11, 12], "margins": [2.0, 2.0, 2.0, 2.0, 0.0, 2.0, 2.0, 2.0],
         "acceptance_lengths": [2, 5]}
    s = {"token_ids": z["token_ids"], "prefix_acceptance": {"drafts": 3, "accepted_tokens": 1,
                                                           "mean_acceptance_length": 4 / 3}}
    pool = conf.pooled([conf.compare_prompt(z, s, bound=0.5)])
    assert pool["vllm_acceptance_cut"] == 1.0 and pool["gap_cut_both"] == round(1.0 / 1.5 - 1, 4)
    assert pool["within_cut_both"] is False


def test_a_record_keeps_the_count_of_the_bars_file_it_was_made_under(monkeypatch):
    # The first bars.yaml with a conformance section counts z-lab's crossing step whole; a served
    # record that names the version before it keeps the cut count, and so its miss.
    import subprocess

    repo = conf.HERE.parents[1]
    log = subprocess.run(["git", "-C", str(repo), "log", "--format=%H", "--", "tests/gpu/bars.yaml"],
                         capture_output=True, text=True, check=True).stdout.split()
    blobs = [subprocess.run(["git", "-C", str(repo), "rev-parse", f"{c}:tests/gpu/bars.yaml"], capture_output=True,
                            text=True, check=True).stdout.strip() for c in log]
    texts = {b: conf.bars.parse(subprocess.run(["git", "-C", str(repo), "cat-file", "-p", b], capture_output=True,
                                               text=True, check=True).stdout) for b in blobs}
    before = next(b for b in blobs if "conformance" not in texts[b])
    assert conf.bars.at(before).get("conformance") is None
    z = {"token_ids": [5, 6, 7, 8, 9, 10, 11, 12], "margins": [2.0, 2.0, 2.0, 2.0, 0.0, 2.0, 2.0, 2.0],
         "acceptance_lengths": [2, 5]}
    zlab = _zlab([z] * 2)
    twin = {"rows": [{"token_ids": z["token_ids"], "margins": [1.9, 1.9, 1.9, 1.9, 1.9, 1.9, 1.9, 0.1]}] * 2}
    row = {"token_ids": z["token_ids"], "prefix_acceptance": {"drafts": 2, "accepted_tokens": 5,
                                                              "mean_acceptance_length": 3.5}}
    monkeypatch.setattr(conf, "noise_bound", lambda *a: 0.5)
    monkeypatch.setattr(conf.bars, "get", lambda s, k: {"margin_move_percentile": 99, "min_prompts": 2}[k])
    old = conf.judge(zlab, twin, {"vllm": "0.33.0", "bars": before, "rows": [row] * 2})
    assert old["acceptance_count"] == "cut" and not old["holds"] and old["holds_whole_steps"]
    assert conf.bars.load()["conformance"]["acceptance_count"] == "whole_steps"  # the current file counts whole
    now = conf.judge(zlab, twin, {"vllm": "0.33.0", "rows": [row] * 2})
    assert now["acceptance_count"] == "whole_steps" and now["holds"]
    with pytest.raises(ValueError, match="not in this checkout's git history"):
        conf.bars.at("0" * 40)


def test_an_earlier_run_keeps_its_miss_on_the_page_beside_a_newer_run():
    # The earlier record was judged by the cut count and missed; the newer one holds. The page
    # lists both, each with its own verdict, and the earlier miss in the headline table.
    rel = {"vllm": "0.33.0", "variant": None, "label": "0.33.0", "series": "s" * 64, "holds": False,
           "acceptance_count": "cut", "identical_over_prefix": 36, "prompts": 36,
           "acceptance": {"zlab_acceptance": 2.4571, "vllm_acceptance": 2.9714, "gap": 0.2093,
                          "zlab_acceptance_whole_steps": 2.9714, "gap_whole_steps": 0.0}}
    lines = conf._earlier_lines([("first.json", {"bars": "b" * 40, "releases": [rel]})])
    row = next(line for line in lines if line.startswith("| first.json"))
    assert "| cut | 2.4571 | 2.9714 | 0.2093 |" in row and row.endswith("**no** |")
    assert any(line.startswith("- cut: ") and "unlike counts" in line for line in lines)
    now = dict(rel, holds=True, acceptance_count="whole_steps")
    assert conf.counted(now) == (2.9714, 0.0) and conf.counted(rel) == (2.4571, 0.2093)
    assert conf._earlier_lines([]) == []


def test_a_served_record_of_another_drafter_or_target_than_z_labs_is_refused(monkeypatch):
    monkeypatch.setattr(conf.bars, "get", lambda s, k: {"margin_move_percentile": 99, "min_prompts": 2}[k])
    z = [{"token_ids": [5, 6, 7], "margins": [2.0] * 3, "acceptance_lengths": [2]}] * 2
    zlab = {**_zlab(z), "target_sha256": "t" * 64, "drafter_sha256": "d" * 64}
    twin = {"rows": [{"token_ids": [5, 6, 7], "margins": [1.9] * 3}] * 2}
    acc = {"drafts": 1, "accepted_tokens": 1, "mean_acceptance_length": 2.0}
    served = {"vllm": "0.33.0", "series": "s", "target_sha256": "t" * 64, "drafter_sha256": "e" * 64,
              "rows": [{"token_ids": [5, 6, 7], "acceptance": acc}] * 2}
    with pytest.raises(ValueError, match="the served record ran drafter_sha256 eeeeeeee, z-lab's record dddddddd"):
        conf.judge(zlab, twin, served)
    assert conf.judge(zlab, twin, {**served, "drafter_sha256": "d" * 64})["identical_over_prefix"] == 2
    legacy = {k: v for k, v in served.items() if not k.endswith("sha256")}  # made before records named them
    assert conf.judge(zlab, twin, legacy)["identical_over_prefix"] == 2


def test_a_served_record_of_other_prompts_or_prefixes_is_refused_not_cut_to_fit(monkeypatch):
    """judge zipped the rows (a short served record lost prompts silently), and computed the
    prefixes afresh even where the served run had stopped its prompts at others."""
    monkeypatch.setattr(conf.bars, "get", lambda s, k: {"margin_move_percentile": 50, "min_prompts": 2}[k])
    z = [{"token_ids": [5, 6, 7, 8, 9], "margins": [2.0, 2.0, 2.0, 0.0, 2.0], "acceptance_lengths": [2, 2]}] * 2
    twin = {"rows": [{"token_ids": [5, 6, 7, 8, 9], "margins": [1.5, 1.5, 1.5, 0.5, 1.5]}] * 2}
    acc = {"drafts": 1, "accepted_tokens": 1, "mean_acceptance_length": 2.0}
    row = {"token_ids": [5, 6, 7, 1, 1], "acceptance": acc, "prefix_acceptance": acc}
    with pytest.raises(ValueError, match="the served record has 1 prompts, z-lab's 2"):
        conf.judge(_zlab(z), twin, {"vllm": "0.33.0", "series": "s", "rows": [row]})
    same = {"vllm": "0.33.0", "series": "s", "rows": [row] * 2, "prefixes": [3, 3], "noise_bound": 0.5}
    assert conf.judge(_zlab(z), twin, same)["prefix_runs"] == {"needed": 2, "made": 2}
    with pytest.raises(ValueError, match="the served run's prefixes differ"):
        conf.judge(_zlab(z), twin, {**same, "prefixes": [4, 3]})
