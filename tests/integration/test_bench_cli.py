"""``launcher bench`` end to end against stub OpenAI-compatible servers on 127.0.0.1.

The stub (``stub_openai.StubServer``) stands in for ``vllm serve``, which
needs a GPU: it streams ``/v1/completions`` with a set first-token delay and
tokens per chunk, and serves vLLM 0.21.0's speculative-decoding counters on
``/metrics``. The expected numbers below come from the stub's settings, not
from the launcher's output. The ``vllm bench serve`` wrapper is checked
against the real released vLLM 0.21.0 ``benchmarks/serve.py`` (its flags and
the result keys it saves), downloaded once from PyPI.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from launcher import pypi
from launcher.bench import vllm_bench, workload
from launcher.bench.client import Target
from launcher.recipe import BenchWorkload
from tests.integration import stub_openai
from tests.integration.stub_openai import Behaviour, StubServer

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = yaml.safe_load((ROOT / "recipes" / "gemma4-moe-dflash.yaml").read_text())


def launcher(args: list[str], tmp: Path, env: dict | None = None, path_prefix: str | None = None) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("VLLM_API_KEY",)}
    full.update(PYTHONPATH=str(ROOT), MODELS_DIR=str(tmp / "models"))
    if path_prefix:
        full["PATH"] = path_prefix + os.pathsep + full["PATH"]
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "launcher", *args], env=full, capture_output=True, text=True,
                          timeout=300, cwd=tmp)


def small_recipe(tmp: Path, **bench) -> Path:
    data = dict(SHIPPED)
    data["bench"] = {"workloads": [{"name": "short", "dataset": "random", "input_len": 64, "output_len": 24,
                                    "concurrency": [1, 3], "prompts_per_stream": 2}], **bench}
    path = tmp / "small.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_shipped_recipe_workloads_against_a_drafter_server(tmp_path):
    tpc = 4
    with StubServer(Behaviour(tokens_per_chunk=tpc, drafter=True)) as stub:
        proc = launcher(["bench", "--recipe", "gemma4-moe-dflash", "--url", stub.url, "--client", "builtin",
                         "--out", "res.json"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads((tmp_path / "res.json").read_text())
    top = SHIPPED["profiles"][SHIPPED["default_profile"]]["serve"]["max_num_seqs"]
    expected = [(w["name"], c) for w in SHIPPED["bench"]["workloads"] for c in (1, top)]
    assert [(r["workload"], r["concurrency"]) for r in doc["runs"]] == expected
    assert doc["model"] == SHIPPED["target"]["served_names"][0] and doc["speculative_decoding"] is True
    for run in doc["runs"]:
        wl = next(w for w in SHIPPED["bench"]["workloads"] if w["name"] == run["workload"])
        n = run["concurrency"] * wl.get("prompts_per_stream", 4)
        assert (run["num_prompts"], run["completed"], run["failed"]) == (n, n, 0)
        assert run["total_output_tokens"] == n * wl["output_len"]
        assert run["output_throughput"] == pytest.approx(run["total_output_tokens"] / run["duration"], rel=1e-6)
        assert run["mean_ttft_ms"] >= 20.0  # the stub's first-token delay
        spec = run["spec_decode"]
        # Only this run's requests: every chunk after the first is one draft step.
        assert spec["drafts"] == n * (wl["output_len"] // tpc - 1)
        assert spec["mean_acceptance_length"] == pytest.approx(tpc)
        assert spec["acceptance_rate_pct"] == pytest.approx(100.0 * (tpc - 1) / 15)
        assert spec["per_position_acceptance"][: tpc - 1] == [1.0] * (tpc - 1)
        assert spec["per_position_acceptance"][tpc - 1:] == [0.0] * (15 - tpc + 1)
    random_bodies = [b for b in stub.bodies if isinstance(b["prompt"], list)]
    assert {len(b["prompt"]) for b in random_bodies} == {SHIPPED["bench"]["workloads"][0]["input_len"]}
    assert all(b["stream"] and b["temperature"] == 0.0 for b in stub.bodies)
    assert "accept 20.0% len 4.00" in proc.stdout


def test_compare_without_drafter_against_a_baseline_server(tmp_path):
    recipe = small_recipe(tmp_path)
    with StubServer(Behaviour(tokens_per_chunk=3, drafter=True, chunk_s=0.004)) as fast, \
            StubServer(Behaviour(tokens_per_chunk=1, drafter=False, chunk_s=0.004)) as slow:
        proc = launcher(["bench", "--recipe", str(recipe), "--url", fast.url, "--client", "builtin", "--out", "r.json",
                         "--compare-without-drafter", "--baseline-url", slow.url], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["without_drafter"]["speculative_decoding"] is False
    assert all(r["spec_decode"] is None for r in doc["without_drafter"]["runs"])
    assert [(r["workload"], r["concurrency"]) for r in doc["comparison"]] == [("short", 1), ("short", 3)]
    runs = {(r["workload"], r["concurrency"]): r for r in doc["runs"]}
    base = {(r["workload"], r["concurrency"]): r for r in doc["without_drafter"]["runs"]}
    for row in doc["comparison"]:
        # Each row pairs the two servers' runs of one workload and level, and the speed-up is
        # their throughput ratio. (Whether 3 tokens a chunk beat 1 is wall-clock timing, which a
        # loaded machine bends: 1.11x was seen with three suites on two cores; not asserted here.)
        key = (row["workload"], row["concurrency"])
        mine, theirs = runs[key]["output_throughput"], base[key]["output_throughput"]
        assert row["output_tok_s"] == {"with_drafter": mine, "without": theirs}
        assert mine > 0 and theirs > 0 and row["speedup"] == pytest.approx(mine / theirs)
        assert row["mean_acceptance_length"] == runs[key]["spec_decode"]["mean_acceptance_length"] > 1
    assert "with drafter vs without" in proc.stdout and "warning" not in proc.stderr


def test_concurrency_levels_given_on_the_command_line_replace_the_recipes(tmp_path):
    recipe = small_recipe(tmp_path)
    with StubServer(Behaviour(tokens_per_chunk=2, drafter=True)) as server:
        proc = launcher(["bench", "--recipe", str(recipe), "--url", server.url, "--client", "builtin", "--out", "c.json",
                         "--concurrency", "2,4"], tmp_path)
        bad = launcher(["bench", "--recipe", str(recipe), "--url", server.url, "--concurrency", "2,x"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    runs = json.loads((tmp_path / "c.json").read_text())["runs"]
    # prompts_per_stream 2: twice the level's requests, every one answered
    assert [(r["concurrency"], r["num_prompts"], r["completed"]) for r in runs] == [(2, 4, 4), (4, 8, 8)]
    assert bad.returncode == 2 and "--concurrency '2,x': 'x' is not a positive integer" in bad.stderr

def test_min_requests_raises_a_levels_request_count_and_never_lowers_it(tmp_path):
    recipe = small_recipe(tmp_path)
    with StubServer(Behaviour(tokens_per_chunk=2, drafter=True)) as server:
        proc = launcher(["bench", "--recipe", str(recipe), "--url", server.url, "--client", "builtin", "--out", "m.json",
                         "--concurrency", "1,8", "--min-requests", "6"], tmp_path)
        bad = launcher(["bench", "--recipe", str(recipe), "--url", server.url, "--min-requests", "0"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    runs = json.loads((tmp_path / "m.json").read_text())["runs"]
    # prompts_per_stream 2: level 1 would send 2, raised to 6; level 8 sends its own 16
    assert [(r["concurrency"], r["num_prompts"], r["completed"]) for r in runs] == [(1, 6, 6), (8, 16, 16)]
    assert bad.returncode == 2 and "--min-requests 0" in bad.stderr
    assert server.completions == 6 + 16 + 1 + 1 + 8  # the measured requests and the warm-ups (one, then one per level)


def test_compare_from_an_earlier_result_and_a_baseline_that_drafts_is_flagged(tmp_path):
    recipe = small_recipe(tmp_path)
    with StubServer(Behaviour(tokens_per_chunk=2, drafter=True)) as server:
        first = launcher(["bench", "--recipe", str(recipe), "--url", server.url, "--client", "builtin", "--out", "a.json"], tmp_path)
        assert first.returncode == 0, first.stderr
        proc = launcher(["bench", "--recipe", str(recipe), "--url", server.url, "--client", "builtin", "--out", "b.json",
                         "--compare-without-drafter", "--baseline-result", "a.json"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "runs speculative decoding too" in proc.stderr


def test_a_baseline_result_of_another_recipe_or_of_other_levels_compares_nothing_and_says_so(tmp_path):
    """Another recipe's result was compared as "same recipe"; one of other concurrency levels gave
    an empty table and exit 0."""
    recipe = small_recipe(tmp_path)
    with StubServer(Behaviour(tokens_per_chunk=2, drafter=True)) as server:
        first = launcher(["bench", "--recipe", str(recipe), "--url", server.url, "--client", "builtin", "--out", "a.json",
                          "--concurrency", "2"], tmp_path)
        assert first.returncode == 0, first.stderr
        other = json.loads((tmp_path / "a.json").read_text())
        (tmp_path / "other.json").write_text(json.dumps({**other, "recipe": "gemma4-e4b"}))
        served = server.completions
        wrong = launcher(["bench", "--recipe", str(recipe), "--url", server.url, "--client", "builtin",
                          "--compare-without-drafter", "--baseline-result", "other.json"], tmp_path)
        assert wrong.returncode == 2 and "measured recipe gemma4-e4b" in wrong.stderr
        assert server.completions == served  # refused before any request
        levels = launcher(["bench", "--recipe", str(recipe), "--url", server.url, "--client", "builtin", "--out", "b.json",
                           "--concurrency", "1", "--compare-without-drafter", "--baseline-result", "a.json"], tmp_path)
    assert levels.returncode == 2 and "nothing compared" in levels.stderr
    assert json.loads((tmp_path / "b.json").read_text())["comparison"] == []  # the measurement is kept


def test_compare_without_a_baseline_says_how_to_start_one(tmp_path):
    with StubServer(Behaviour(drafter=True)) as server:
        proc = launcher(["bench", "--recipe", "gemma4-moe-dflash", "--url", server.url, "--compare-without-drafter"], tmp_path)
    assert proc.returncode == 2
    assert "--set drafter=null" in proc.stderr and "--baseline-url" in proc.stderr
    assert server.completions == 0


def test_api_key_is_sent_and_never_printed(tmp_path):
    key = "sk-bench-secret-0123456789"
    recipe = small_recipe(tmp_path)
    with StubServer(Behaviour(api_key=key)) as server:
        denied = launcher(["bench", "--recipe", str(recipe), "--url", server.url, "--client", "builtin"], tmp_path)
        ok = launcher(["bench", "--recipe", str(recipe), "--url", server.url, "--client", "builtin", "--out", "k.json"],
                      tmp_path, env={"VLLM_API_KEY": key})
    assert denied.returncode == 2 and "HTTP 401" in denied.stderr
    assert ok.returncode == 0, ok.stderr
    assert key not in ok.stdout + ok.stderr + (tmp_path / "k.json").read_text()


def test_no_server_and_unknown_workload_are_clear_errors(tmp_path):
    proc = launcher(["bench", "--recipe", "gemma4-moe-dflash", "--url", "http://127.0.0.1:9"], tmp_path)
    assert proc.returncode == 2 and "no OpenAI-compatible server answers at http://127.0.0.1:9" in proc.stderr
    with StubServer(Behaviour()) as server:
        proc = launcher(["bench", "--recipe", "gemma4-moe-dflash", "--url", server.url, "--workload", "nope"], tmp_path)
    assert proc.returncode == 2 and "no bench workload nope" in proc.stderr


def test_bench_section_errors_name_file_line_and_field(tmp_path):
    text = (ROOT / "recipes" / "gemma4-moe-dflash.yaml").read_text()
    bad = text.replace("concurrency: [1, max]}", "concurrency: [1, 1]}", 1)
    path = tmp_path / "bad.yaml"
    path.write_text(bad)
    proc = launcher(["recipes", "validate", str(path)], tmp_path)
    line = next(i for i, l in enumerate(bad.splitlines(), 1) if "concurrency: [1, 1]" in l)
    assert proc.returncode == 2
    assert f"{path}:{line}: field bench.workloads.0.concurrency: concurrency levels repeat" in proc.stderr


# --------------------------------------------------------------------------- vllm bench serve


def _released_serve_sources() -> str:
    root = pypi.unpacked("vllm", "0.21.0", "site-packages") / "vllm" / "benchmarks"
    return (root / "serve.py").read_text() + (root / "datasets" / "datasets.py").read_text()


@pytest.mark.network
def test_every_vllm_bench_flag_exists_in_vllm_0_21_0():
    source = _released_serve_sources()
    defined = set(re.findall(r'"(--[a-z0-9-]+)"', source))
    for dataset in ("random", "prompts"):
        run = workload.Run(BenchWorkload(name="w", dataset=dataset), concurrency=4, num_prompts=8)
        argv = vllm_bench.argv(Target("http://127.0.0.1:8000", "gemma4"), run, tokenizer="/m", temperature=0.0, seed=0,
                               ignore_eos=True, result_dir=Path("/tmp"), result_file="r.json")
        assert argv[:3] == ["vllm", "bench", "serve"]
        used = {a for a in argv if a.startswith("--")}
        assert used <= defined, f"not defined by vLLM 0.21.0: {used - defined}"
        assert f'"{argv[argv.index("--dataset-name") + 1]}"' in source  # a dataset choice it knows
    assert '"openai": async_request_openai_completions' in (
        pypi.unpacked("vllm", "0.21.0", "site-packages") / "vllm/benchmarks/lib/endpoint_request_func.py").read_text()


@pytest.mark.network
def test_result_keys_read_are_keys_vllm_0_21_0_saves():
    source = _released_serve_sources()
    for key in ("duration", "completed", "failed", "total_input_tokens", "total_output_tokens", "request_throughput",
                "output_throughput", "errors", "spec_decode_acceptance_rate", "spec_decode_acceptance_length"):
        assert f'"{key}"' in source, key
    assert 'result[f"mean_{metric_attribute_name}_ms"]' in source
    assert 'result[f"median_{metric_attribute_name}_ms"]' in source
    assert re.search(r'result\[\s*f"p\{p_word\}_\{metric_attribute_name\}_ms"', source)


def test_client_vllm_runs_vllm_bench_serve_and_maps_its_result(tmp_path):
    """``vllm`` itself needs a GPU stack, so a stand-in script on PATH answers
    for it: it records its argv and saves a result with the keys (checked
    above against the release) and values chosen here."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "vllm"
    script.write_text(
        "#!" + sys.executable + "\n"
        "import json, sys, pathlib\n"
        "a = sys.argv[1:]\n"
        "d = pathlib.Path(a[a.index('--result-dir') + 1]); f = a[a.index('--result-filename') + 1]\n"
        "(pathlib.Path(__file__).parent / 'argv.jsonl').open('a').write(json.dumps(a) + '\\n')\n"
        "c = int(a[a.index('--max-concurrency') + 1])\n"
        "json.dump({'duration': 2.0, 'completed': 4 * c, 'failed': 0, 'total_input_tokens': 10, 'total_output_tokens': 96 * c,"
        " 'request_throughput': 2.0 * c, 'output_throughput': 48.0 * c, 'mean_ttft_ms': 30.0, 'median_ttft_ms': 29.0,"
        " 'p99_ttft_ms': 41.0, 'mean_tpot_ms': 7.5, 'median_tpot_ms': 7.0, 'p99_tpot_ms': 9.0, 'mean_itl_ms': 7.5,"
        " 'median_itl_ms': 7.0, 'p99_itl_ms': 9.0, 'errors': ['']}, (d / f).open('w'))\n"
    )
    script.chmod(0o755)
    recipe = small_recipe(tmp_path)
    with StubServer(Behaviour(drafter=True, tokens_per_chunk=2)) as server:
        proc = launcher(["bench", "--recipe", str(recipe), "--url", server.url, "--out", "v.json"], tmp_path,
                        path_prefix=str(bin_dir))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads((tmp_path / "v.json").read_text())
    assert doc["client"] == "vllm bench serve"
    assert [r["output_throughput"] for r in doc["runs"]] == [48.0, 144.0]
    first = doc["runs"][0]
    assert (first["mean_ttft_ms"], first["median_ttft_ms"], first["p99_ttft_ms"]) == (30.0, 29.0, 41.0)
    assert (first["duration"], first["total_output_tokens"]) == (2.0, 96)
    calls = [json.loads(l) for l in (bin_dir / "argv.jsonl").read_text().splitlines()]
    assert [c[c.index("--max-concurrency") + 1] for c in calls] == ["1", "3"]
    assert all(c[c.index("--base-url") + 1] == server.url and c[c.index("--model") + 1] == "gemma4" for c in calls)
    # The drafter's acceptance still comes from the server's own /metrics around each run.
    assert all(r["spec_decode"] is not None for r in doc["runs"])


def test_random_ids_stay_inside_the_vocabulary_of_the_tokenizer_folder(tmp_path):
    """The GPU harness benches a trained target of 8,192 ids: vLLM would refuse ids up to 30,000."""
    model = tmp_path / "small-model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"text_config": {"vocab_size": 8192}}))
    with StubServer(Behaviour()) as stub:
        proc = launcher(["bench", "--recipe", str(small_recipe(tmp_path)), "--url", stub.url, "--client", "builtin",
                         "--tokenizer", str(model), "--out", "res.json"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ids = [t for b in stub.bodies if isinstance(b["prompt"], list) for t in b["prompt"]]
    assert ids and max(ids) < 8192 and min(ids) >= 1000
    assert json.loads((tmp_path / "res.json").read_text())["random_token_band"] == [1000, 8192]


def prompts_recipe(tmp: Path) -> Path:
    data = dict(SHIPPED)
    data["bench"] = {"workloads": [{"name": "mine", "dataset": "prompts", "output_len": 24,
                                    "concurrency": [1, 2], "prompts_per_stream": 2}]}
    path = tmp / "prompts.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_own_prompts_by_token_ids_recorded_outputs_and_output_len(tmp_path):
    # The GPU harness benches the gated prompts as token ids and judges what the server said
    # (tests/gpu/runs/served.py's speed phase): the ids sent, the length asked for and the ids
    # recorded are checked against the stub's own function of each prompt, not the launcher's output.
    recipe = prompts_recipe(tmp_path)
    asked = [[11, 12, 13], [21, 22], "a text prompt"]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in asked) + "\n")
    with StubServer(Behaviour(tokens_per_chunk=3, drafter=True)) as server:
        proc = launcher(["bench", "--recipe", str(recipe), "--url", server.url, "--client", "builtin", "--out", "o.json",
                         "--prompts-file", "p.jsonl", "--record-outputs", "--output-len", "10",
                         "--concurrency", "1", "--min-requests", "4"], tmp_path)
        measured = [b for b in server.bodies if not b.get("cache_salt") and b["prompt"] != "Hello"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads((tmp_path / "o.json").read_text())
    (run,) = doc["runs"]
    cycled = [asked[i % 3] for i in range(4)]
    assert [b["prompt"] for b in measured] == cycled
    assert {b["max_tokens"] for b in measured} == {10} and all(b["return_token_ids"] for b in measured)
    assert run["output_len"] == 10 and run["completed"] == 4
    assert run["outputs"] == [stub_openai.completion_tokens(p, 10) for p in cycled]
    assert doc["prompts_file"]["prompts"] == 3 and len(doc["prompts_file"]["sha256"]) == 64


def test_a_server_that_ignores_return_token_ids_fails_each_request_with_why(tmp_path):
    recipe = prompts_recipe(tmp_path)
    with StubServer(Behaviour(token_ids=False)) as server:
        proc = launcher(["bench", "--recipe", str(recipe), "--url", server.url, "--client", "builtin", "--out", "n.json",
                         "--record-outputs", "--concurrency", "1"], tmp_path)
    assert proc.returncode == 2
    assert "the server sent 0 for 24 tokens (does it support return_token_ids?)" in proc.stderr


@pytest.mark.parametrize("line, says", [
    ("not json", "line 2: not JSON"),
    ('{"prompt": ""}', 'line 2: "prompt" must be a non-empty text or a non-empty list of token ids'),
    ('{"prompt": [1, -2]}', 'line 2: "prompt" must be a non-empty text or a non-empty list of token ids'),
    ('{"text": "x"}', 'line 2: "prompt" must be'),
])
def test_a_bad_prompts_file_names_its_line_and_sends_nothing(tmp_path, line, says):
    recipe = prompts_recipe(tmp_path)
    (tmp_path / "p.jsonl").write_text('{"prompt": "fine"}\n' + line + "\n")
    with StubServer(Behaviour()) as server:
        proc = launcher(["bench", "--recipe", str(recipe), "--url", server.url, "--client", "builtin", "--out", "x.json",
                         "--prompts-file", "p.jsonl"], tmp_path)
    assert proc.returncode == 2 and f"--prompts-file p.jsonl, {says}" in proc.stderr, proc.stderr
    assert server.completions == 0 and not (tmp_path / "x.json").exists()


def test_own_prompts_are_refused_where_they_would_not_take_effect(tmp_path):
    (tmp_path / "p.jsonl").write_text('{"prompt": "fine"}\n')
    (tmp_path / "empty.jsonl").write_text("\n")
    with StubServer(Behaviour()) as server:
        random_only = launcher(["bench", "--recipe", str(small_recipe(tmp_path)), "--url", server.url,
                                "--client", "builtin", "--prompts-file", "p.jsonl"], tmp_path)
        vllm_client = launcher(["bench", "--recipe", str(prompts_recipe(tmp_path)), "--url", server.url,
                                "--client", "vllm", "--record-outputs"], tmp_path)
        empty = launcher(["bench", "--recipe", str(prompts_recipe(tmp_path)), "--url", server.url,
                          "--client", "builtin", "--prompts-file", "empty.jsonl"], tmp_path)
    assert random_only.returncode == 2 and "no workload run here sends the prompt set (short: random)" in random_only.stderr
    assert vllm_client.returncode == 2 and "--record-outputs needs the built-in client" in vllm_client.stderr
    assert empty.returncode == 2 and "--prompts-file empty.jsonl: no prompts in it" in empty.stderr
    assert server.completions == 0


def test_a_baseline_result_of_other_prompts_is_refused_before_any_request(tmp_path):
    recipe = prompts_recipe(tmp_path)
    (tmp_path / "p.jsonl").write_text('{"prompt": [5, 6, 7]}\n')
    with StubServer(Behaviour(drafter=False)) as slow:
        base = launcher(["bench", "--recipe", str(recipe), "--url", slow.url, "--client", "builtin", "--out", "b.json",
                         "--concurrency", "1"], tmp_path)
    assert base.returncode == 0, base.stderr
    with StubServer(Behaviour(tokens_per_chunk=2, drafter=True)) as fast:
        proc = launcher(["bench", "--recipe", str(recipe), "--url", fast.url, "--client", "builtin", "--out", "r.json",
                         "--concurrency", "1", "--prompts-file", "p.jsonl",
                         "--compare-without-drafter", "--baseline-result", "b.json"], tmp_path)
    assert proc.returncode == 2, proc.stdout
    assert "--baseline-result b.json ran the bundled prompt set, this run a --prompts-file of sha256" in proc.stderr
    assert fast.completions == 0


def test_chunks_of_token_ids_without_text_still_count_as_tokens_arriving(tmp_path):
    # vLLM holds back the text of a partial character, but its token ids come: from the third
    # chunk on the stub's chunks carry ids alone. The ids are all kept, and the request's
    # timing sees every chunk (TTFT from the first, one gap per later chunk).
    recipe = prompts_recipe(tmp_path)
    (tmp_path / "p.jsonl").write_text('{"prompt": [7, 8, 9]}\n')
    with StubServer(Behaviour(tokens_per_chunk=2, textless_from=2)) as server:
        proc = launcher(["bench", "--recipe", str(recipe), "--url", server.url, "--client", "builtin", "--out", "t.json",
                         "--prompts-file", "p.jsonl", "--record-outputs", "--output-len", "10",
                         "--concurrency", "1"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run,) = json.loads((tmp_path / "t.json").read_text())["runs"]
    # prompts_per_stream 2: the one prompt twice
    assert run["outputs"] == [stub_openai.completion_tokens([7, 8, 9], 10)] * 2 and run["completed"] == 2
    assert run["mean_ttft_ms"] is not None and run["total_output_tokens"] == 20
    # one request in this process: 5 chunks of 2 tokens, the last 3 without text: 4 gaps timed
    from launcher.bench import client

    with StubServer(Behaviour(tokens_per_chunk=2, textless_from=2)) as server:
        res = client.one_request(Target(server.url, "gemma4"), [7, 8, 9], max_tokens=10, temperature=0.0, seed=0,
                                 ignore_eos=True, timeout=30, record=True)
    assert res.ok and len(res.token_ids) == 10 and len(res.itls) == 4


def test_a_partial_result_names_its_prompts_and_a_baseline_of_another_length_is_refused(tmp_path):
    recipe = prompts_recipe(tmp_path)
    (tmp_path / "p.jsonl").write_text('{"prompt": [5, 6, 7]}\n')
    # the server dies after the warm-ups and the first level's requests: the level at 2 fails
    # whole, and the file saved after the first level already says which prompts it ran
    with StubServer(Behaviour(fail_after=1 + 1 + 2)) as dying:
        died = launcher(["bench", "--recipe", str(recipe), "--url", dying.url, "--client", "builtin", "--out", "d.json",
                         "--prompts-file", "p.jsonl", "--concurrency", "1,2"], tmp_path)
    assert died.returncode == 2 and "every request failed" in died.stderr
    partial = json.loads((tmp_path / "d.json").read_text())
    assert [(r["concurrency"], r["completed"]) for r in partial["runs"]] == [(1, 2), (2, 0)]
    assert partial["prompts_file"]["prompts"] == 1
    with StubServer(Behaviour(drafter=False)) as slow:
        base = launcher(["bench", "--recipe", str(recipe), "--url", slow.url, "--client", "builtin", "--out", "b.json",
                         "--prompts-file", "p.jsonl", "--concurrency", "1", "--output-len", "12"], tmp_path)
    assert base.returncode == 0, base.stderr
    with StubServer(Behaviour(tokens_per_chunk=2, drafter=True)) as fast:
        proc = launcher(["bench", "--recipe", str(recipe), "--url", fast.url, "--client", "builtin", "--out", "r.json",
                         "--prompts-file", "p.jsonl", "--concurrency", "1",
                         "--compare-without-drafter", "--baseline-result", "b.json"], tmp_path)
    assert proc.returncode == 2
    assert "--baseline-result b.json ran workload mine at 12 output tokens a request, this run at 24" in proc.stderr
    assert fast.completions == 0


@pytest.mark.network
@pytest.mark.parametrize("version", ["0.21.0", "0.33.0"])
def test_return_token_ids_streams_each_chunks_new_ids_in_both_released_vllms(version):
    """--record-outputs sends ``return_token_ids`` and sums each streamed choice's ``token_ids``
    (client._token_ids), checking the sum against usage's completion_tokens. That holds only if
    the released server streams completions in delta mode and puts the delta's ids on each
    choice, which this reads from the release's own files (the stub above is built to match)."""
    import ast

    site = pypi.unpacked("vllm", version, "site-packages") / "vllm" / "entrypoints" / "openai" / "completion"
    protocol, serving = (site / "protocol.py").read_text(), (site / "serving.py").read_text()
    request = next(n for n in ast.walk(ast.parse(protocol)) if isinstance(n, ast.ClassDef) and n.name == "CompletionRequest")
    fields = {n.target.id for n in request.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    assert "return_token_ids" in fields
    assert "output_kind=RequestOutputKind.DELTAifself.streamelse" in re.sub(r"\s+", "", protocol)
    stream = re.sub(r"\s+", " ", serving)
    assert re.search(r"CompletionResponseStreamChoice\( index=i, text=delta_text,.*?token_ids=\( as_list\(output\.token_ids\) "
                     r"if request\.return_token_ids else None \)", stream)
