"""The recipe's ``hub`` (what `models pull` fetches) and ``bench`` sections:
validation with file:line:field errors, and the shipped pins."""

from __future__ import annotations

import pytest
import yaml

from launcher import recipe as recipes
from launcher.bench import metrics, workload
from launcher.errors import LauncherError

BASE = """name: x
description: d
target:
  name: m
  hub:
    repo: {repo}
    revision: {revision}{extra}
vllm_versions: ["0.21.0"]
min_gpu_memory_gib: 8
profiles:
  rtx5090: {{serve: {{max_num_seqs: 6}}}}
"""
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def parse(repo="org/model", revision=COMMIT, extra="", tail=""):
    return recipes.parse_recipe(BASE.format(repo=repo, revision=revision, extra=extra) + tail, "r.yaml")


def test_pinned_commit_is_accepted_and_reported_pinned():
    hub = parse().target.hub
    assert hub.pinned and not hub.unverified
    assert hub.allow_patterns == recipes.DEFAULT_ALLOW_PATTERNS


def test_branch_without_unverified_is_refused_on_its_line():
    with pytest.raises(LauncherError) as err:
        parse(revision="main")
    assert err.value.message.startswith("r.yaml:5: field target.hub:")
    assert "not a 40-hex commit" in err.value.message and "unverified: true" in err.value.message


def test_branch_marked_unverified_is_accepted_but_not_pinned():
    hub = parse(revision="main", extra="\n    unverified: true").target.hub
    assert not hub.pinned and hub.unverified


@pytest.mark.parametrize("repo", ["model-without-owner", "org/../etc", "org/name/extra", "-org/name"])
def test_bad_repo_ids_are_named(repo):
    with pytest.raises(LauncherError, match=r"r.yaml:6: field target.hub.repo: .* is not a Hugging Face repo id"):
        parse(repo=repo)


def test_shipped_main_recipe_pins_commits_with_evidence():
    rec = recipes.load("gemma4-moe-dflash")
    assert rec.target.hub.repo == "nvidia/Gemma-4-26B-A4B-NVFP4" and rec.target.hub.pinned
    assert rec.drafter.hub.repo == "z-lab/gemma-4-26B-A4B-it-DFlash" and rec.drafter.hub.pinned
    assert rec.target.hub.evidence and rec.drafter.hub.evidence
    # The no-drafter recipe serves the same checkpoint from the same folder.
    base = recipes.load("gemma4-moe")
    assert (base.target.name, base.target.hub.revision) == (rec.target.name, rec.target.hub.revision)


# BASE is 11 lines: "bench:" is line 12, "workloads:" 13, the first workload 14.
BENCH = """bench:
  workloads:
    - {name: a, dataset: random, input_len: 32, output_len: 8, concurrency: [1, max], prompts_per_stream: 2}
    - {name: b, dataset: prompts, output_len: 8, concurrency: [2]}
"""


def test_bench_runs_expand_max_to_the_profile_max_num_seqs():
    rec = parse(tail=BENCH)
    runs = workload.runs(rec, profile=None, only=None)
    assert [(r.workload.name, r.concurrency, r.num_prompts) for r in runs] == [("a", 1, 2), ("a", 6, 12), ("b", 2, 8)]
    assert [r.key for r in workload.runs(rec, profile=None, only=["b"])] == ["b@2"]


def test_bench_concurrency_replaces_every_workloads_levels():
    """--concurrency 1,4,16,max (issues 25 and 27 ask for levels no recipe lists)."""
    rec = parse(tail=BENCH)
    runs = workload.runs(rec, profile=None, only=None, levels=workload.parse_levels("4,1,max"))
    assert [(r.workload.name, r.concurrency, r.num_prompts) for r in runs] == [
        ("a", 1, 2), ("a", 4, 8), ("a", 6, 12), ("b", 1, 4), ("b", 4, 16), ("b", 6, 24)]


def test_numeric_levels_need_no_max_num_seqs_and_max_still_does():
    rec = recipes.parse_recipe(BASE.replace("{{serve: {{max_num_seqs: 6}}}}", "{{}}").format(
        repo="org/model", revision=COMMIT, extra="") + BENCH, "r.yaml")
    runs = workload.runs(rec, profile=None, only=["b"], levels=[1, 4])
    assert [r.concurrency for r in runs] == [1, 4]
    with pytest.raises(LauncherError, match="sets no max_num_seqs"):
        workload.runs(rec, profile=None, only=["b"], levels=["max"])
    with pytest.raises(LauncherError, match="has no profile 'dgx'"):
        workload.runs(rec, profile="dgx", only=None, levels=[1])

@pytest.mark.parametrize("text", ["0", "1,,4", "four", "-2", "1.5", "\u00b2"])
def test_bench_concurrency_refuses_what_is_not_a_level(text):
    with pytest.raises(LauncherError) as err:
        workload.parse_levels(text)
    assert err.value.message.startswith(f"--concurrency {text!r}:")

def test_bench_prompts_are_exact_length_token_ids_or_the_bundled_set():
    rec = parse(tail=BENCH)
    a, _, b = workload.runs(rec, profile=None, only=None)
    ids = workload.prompts(a, seed=0)
    assert len(ids) == 2 and all(len(p) == 32 for p in ids)
    assert ids == workload.prompts(a, seed=0) != workload.prompts(a, seed=1)  # seeded
    texts = workload.prompts(b, seed=0)
    assert texts[:4] == workload.bundled_prompts()[:4] and len(texts) == 8


@pytest.mark.parametrize("bad, line, field, msg", [
    ("    - {name: a, concurrency: [0]}\n", 14, "bench.workloads.0.concurrency", "integers >= 1 or 'max', not 0"),
    ("    - {name: a, concurrency: [1, most]}\n", 14, "bench.workloads.0.concurrency", "not 'most'"),
    ("    - {name: a, dataset: sharegpt}\n", 14, "bench.workloads.0.dataset", "Input should be 'random' or 'prompts'"),
    ("    - {name: a}\n    - {name: a}\n", 13, "bench.workloads", "workload names repeat"),
])
def test_bench_errors_name_file_line_and_field(bad, line, field, msg):
    with pytest.raises(LauncherError) as err:
        parse(tail="bench:\n  workloads:\n" + bad)
    assert err.value.message.startswith(f"r.yaml:{line}: field {field}:")
    assert msg in err.value.message


def test_metrics_sum_engines_and_skip_created_samples():
    text = "\n".join([
        "# TYPE vllm:spec_decode_num_drafts counter",
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0',
        'vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 5.0',
        'vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7e9',
        'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 150.0',
        'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 60.0',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 12.0',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="0"} 3.0',
        'vllm:generation_tokens_total{engine="0",model_name="m"} 999.0',
    ])
    after = metrics.parse(text)
    assert (after.drafts, after.draft_tokens, after.accepted, after.per_position) == (15.0, 150.0, 60.0, {0: 15.0})
    acc = metrics.acceptance(metrics.SpecCounters(drafts=5.0, draft_tokens=50.0, accepted=20.0, per_position={0: 5.0}), after)
    assert acc["acceptance_rate_pct"] == pytest.approx(40.0)  # 40 of 100 drafted tokens
    assert acc["mean_acceptance_length"] == pytest.approx(5.0)  # 1 + 40 / 10 drafts
    assert acc["per_position_acceptance"] == [pytest.approx(1.0)]


def test_metrics_without_a_drafter_are_none():
    assert metrics.parse('vllm:generation_tokens_total{engine="0"} 5.0\n') is None
    assert metrics.acceptance(None, None) is None


# --- one folder, one source (issue 29.2) -------------------------------------


def _folders_by_recipe():
    for name in recipes.available():
        rec = recipes.load(name)
        for role, ref in (("target", rec.target), ("drafter", rec.drafter)):
            if ref is not None:
                yield name, role, ref


def test_every_recipe_naming_a_folder_gets_the_same_source():
    seen = {}
    for name, role, ref in _folders_by_recipe():
        origin = (ref.source, ref.hub.model_dump() if ref.hub else None, getattr(ref, "format", None))
        seen.setdefault(ref.name, {})[name] = origin
    shared_folder = seen["gemma-4-26B-A4B-it-NVFP4"]
    assert {"gemma4-moe-dflash", "gemma4-moe-dflash-text", "gemma4-moe"} <= set(shared_folder)
    for folder, by_recipe in seen.items():
        assert len({repr(o) for o in by_recipe.values()}) == 1, (folder, by_recipe)
    # The text-only recipe was the one without a hub: now it fetches the pinned checkpoint too.
    text = recipes.load("gemma4-moe-dflash-text")
    assert text.target.hub.repo == "nvidia/Gemma-4-26B-A4B-NVFP4" and text.target.hub.pinned
    assert text.drafter.hub.repo == "z-lab/gemma-4-26B-A4B-it-DFlash"


SHARED_FOLDER = """name: x
description: d
target:
  name: gemma-4-26B-A4B-it-NVFP4{target_extra}
vllm_versions: ["0.21.0"]
min_gpu_memory_gib: 8
profiles:
  rtx5090: {{serve: {{max_num_seqs: 6}}}}
"""


def test_a_recipe_that_omits_the_entry_gets_the_shared_one_and_its_own_wins():
    shared = recipes.shared_models()["gemma-4-26B-A4B-it-NVFP4"]
    omitted = recipes.parse_recipe(SHARED_FOLDER.format(target_extra=""), "r.yaml")
    assert omitted.target.hub == shared.hub and omitted.target.format == "modelopt-nvfp4"
    assert omitted.target.source == shared.source
    own = recipes.parse_recipe(SHARED_FOLDER.format(
        target_extra=f"\n  format: bf16\n  hub: {{repo: mirror/copy, revision: {COMMIT}}}"), "r.yaml")
    assert (own.target.hub.repo, own.target.hub.revision, own.target.format) == ("mirror/copy", COMMIT, "bf16")


def test_shipped_recipes_leave_model_sources_to_the_shared_entries():
    """Were a shipped recipe to state a source again, two recipes could disagree about one folder."""
    for path in recipes.available().values():
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        for role in ("target", "drafter"):
            ref = data.get(role) or {}
            assert ref["name"] in recipes.shared_models() if ref else True, (path.name, role)
            assert not {"source", "hub", "format"} & set(ref), (path.name, role)


def test_models_list_gives_the_shared_folder_its_hub_whichever_recipe_comes_first(models):
    from typer.testing import CliRunner

    from launcher.cli import app

    res = CliRunner().invoke(app, ["models", "list"])
    assert res.exit_code == 0, res.output
    row = next(line for line in res.output.splitlines() if line.startswith("gemma-4-26B-A4B-it-NVFP4 "))
    assert "nvidia/Gemma-4-26B-A4B-NVFP4@a19cfe00be84" in row and "does not fetch it" not in row
    assert "gemma4-moe-dflash-text" in row


def test_the_text_recipe_names_models_pull_for_its_missing_checkpoint(models):
    import json

    from typer.testing import CliRunner

    from launcher.cli import app

    res = CliRunner().invoke(app, ["serve", "--recipe", "gemma4-moe-dflash-text", "--dry-run", "--json",
                                   "--vllm-version", "0.21.0"])
    hints = {r["area"]: r["hint"] for r in json.loads(res.stdout)["reasons"]}
    assert hints["checkpoint"] == "fetch it with: launcher models pull --recipe gemma4-moe-dflash-text"


def test_random_prompts_stay_inside_a_small_models_vocabulary(tmp_path):
    """vLLM refuses an id past the vocabulary: the harness's trained target has 8,192."""
    rec = parse(tail=BENCH)
    a = workload.runs(rec, profile=None, only=None)[0]
    assert workload.token_band(None) == workload.token_band(262144) == workload.RANDOM_TOKEN_RANGE
    assert workload.token_band(8192) == (1000, 8192)
    assert workload.token_band(1500) == (750, 1500)
    ids = workload.prompts(a, seed=0, vocab_size=8192)
    assert all(1000 <= t < 8192 for p in ids for t in p)
    assert workload.prompts(a, seed=0) == workload.prompts(a, seed=0, vocab_size=None)  # unchanged without one
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text('{"text_config": {"vocab_size": 8192}, "vocab_size": 5}')
    assert workload.vocab_size(tmp_path / "m") == 8192
    (tmp_path / "m" / "config.json").write_text('{"vocab_size": 4096}')
    assert workload.vocab_size(tmp_path / "m") == 4096
    assert workload.vocab_size(tmp_path / "nothing") is None and workload.vocab_size(None) is None
    assert workload.vocab_size("google/gemma-4-26B-A4B-it") is None  # a repo id, not a folder


def test_a_tokenizer_folder_whose_config_is_not_an_object_sets_no_vocabulary(tmp_path):
    """A config.json holding a list gave AttributeError: the prompts then fall back to no bound."""
    from launcher.bench import workload

    (tmp_path / "config.json").write_text("[1, 2]")
    assert workload.vocab_size(tmp_path) is None
    (tmp_path / "config.json").write_text('{"text_config": {"vocab_size": 262144}}')
    assert workload.vocab_size(tmp_path) == 262144


def test_a_tokenizer_path_that_is_no_folder_is_refused_before_any_request(tmp_path):
    """It was ignored in silence; a repository id (org/name) stays vllm bench serve's to resolve."""
    from typer.testing import CliRunner

    from launcher.bench import cli as bench_cli
    from launcher.cli import app

    missing = tmp_path / "no-model"
    res = CliRunner().invoke(app, ["bench", "-r", "gemma4-moe", "--url", "http://127.0.0.1:9", "--tokenizer",
                                   str(missing), "--out", str(tmp_path / "b.json")])
    assert res.exit_code == 2 and f"--tokenizer {missing}: no such folder" in res.output
    assert not (tmp_path / "b.json").exists()
    bench_cli._check_tokenizer("google/gemma-4-26B-A4B-it")  # a repository id passes
    bench_cli._check_tokenizer(str(tmp_path))  # a folder passes


def _keyed_server(key: str):
    """A stand-in OpenAI server (no vLLM here) that wants ``key`` as its bearer token."""
    import threading
    from http.server import ThreadingHTTPServer

    from tests.unit.stand_in_openai import Handler

    class Keyed(Handler):
        def do_GET(self):
            if self.headers.get("Authorization") != f"Bearer {key}":
                self.send_response(401)
                self.end_headers()
                return
            super().do_GET()

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Keyed)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def test_bench_takes_the_endpoint_serve_prints_and_names_a_wrong_key_as_wrong():
    """`launcher serve` prints http://H:P/v1; bench asked that for /v1/v1/models (HTTP 404). A
    key given but refused got the hint to pass a key."""
    from launcher.bench import cli as bench_cli
    from launcher.bench import runner
    from launcher.errors import LauncherError

    srv = _keyed_server("right-key")
    try:
        root = f"http://127.0.0.1:{srv.server_address[1]}"
        for given in (root, root + "/", root + "/v1", root + "/v1/"):
            assert runner.server_models(bench_cli._server_root(given), "right-key") == ["gemma4"]
        with pytest.raises(LauncherError) as wrong:
            runner.server_models(root, "wrong-key")
        assert "refused the key given" in wrong.value.hint and "wrong-key" not in str(wrong.value) + wrong.value.hint
        with pytest.raises(LauncherError) as none:
            runner.server_models(root, None)
        assert none.value.hint == "pass --api-key (or set VLLM_API_KEY)"
    finally:
        srv.shutdown()


def test_bench_refuses_a_server_that_serves_none_of_the_recipes_names():
    """A gemma4-e4b bench against a server of gemma4 measured gemma4 and filed it as gemma4-e4b."""
    from launcher.bench import runner
    from launcher.errors import LauncherError

    e4b = recipes.load("gemma4-e4b")
    with pytest.raises(LauncherError, match="the server serves gemma4, none of recipe gemma4-e4b's names"):
        runner.choose_model(e4b, ["gemma4"], None)
    assert runner.choose_model(e4b, ["gemma4"], "gemma4") == "gemma4"  # asked for by name: measured
    assert runner.choose_model(recipes.load("gemma4-moe-dflash"), ["x", "gemma4-fast"], None) == "gemma4-fast"
