"""``launcher bench`` keeps what it measured and refuses bad input up front (issue 28.6, 28.10;
29.5's result keys and progress).

Against the stub server of test_bench_cli (it stands in for ``vllm serve``,
which needs a GPU), set to misbehave the ways real servers and proxies do.
"""

from __future__ import annotations

import errno
import json
import subprocess

import pytest

from launcher.bench import client, metrics
from launcher.bench.client import Target
from tests.integration.stub_openai import Behaviour, StubServer
from tests.integration.test_bench_cli import launcher, small_recipe


def _bench(tmp_path, server, *extra):
    recipe = small_recipe(tmp_path)
    return launcher(["bench", "--recipe", str(recipe), "--url", server.url, "--client", "builtin", *extra], tmp_path)


@pytest.mark.parametrize("case", ["folder", "parent-is-a-file"])
def test_an_unwritable_out_is_refused_before_any_request(case, tmp_path):
    if case == "folder":
        (tmp_path / "results").mkdir()
        out = "results"
    else:
        (tmp_path / "notes.txt").write_text("x")
        out = "notes.txt/r.json"
    with StubServer(Behaviour()) as server:
        proc = _bench(tmp_path, server, "--out", out)
    assert proc.returncode == 2
    assert f"--out {out}" in proc.stderr and "Traceback" not in proc.stderr
    assert server.completions == 0  # nothing was measured, so nothing was lost


def test_finished_runs_are_written_when_a_later_run_fails(tmp_path):
    # The warm-up, run 1's warm-up round (c=1: one request) and its two requests succeed;
    # run 2 (c=3) gets HTTP 500 only, its warm-up round included.
    with StubServer(Behaviour(fail_after=4)) as server:
        proc = _bench(tmp_path, server, "--out", "r.json")
    assert proc.returncode == 2 and "every request failed" in proc.stderr
    doc = json.loads((tmp_path / "r.json").read_text())
    # The finished run is kept, and the failed one is recorded with why.
    assert [(r["concurrency"], r["completed"]) for r in doc["runs"]] == [(1, 2), (3, 0)]
    # a warm-up that failed is said, not passed over
    assert "warm-up of short@3: 3 of 3 requests failed (HTTP 500" in proc.stdout + proc.stderr
    assert doc["runs"][0]["mean_ttft_ms"] is not None and "HTTP 500" in doc["runs"][1]["errors"][0]


def test_each_level_is_warmed_up_unmeasured_with_its_own_concurrency(tmp_path):
    with StubServer(Behaviour()) as server:
        proc = _bench(tmp_path, server, "--out", "r.json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads((tmp_path / "r.json").read_text())
    short = [b for b in server.bodies if b["max_tokens"] != 24]  # the workload's output_len is 24
    # the first "Hello", then one round per level: 1 request at c=1, 3 at c=3
    assert [b["max_tokens"] for b in short] == [8] + [16] * (1 + 3)
    measured = [b for b in server.bodies if b["max_tokens"] == 24]
    assert len(measured) == 2 + 6
    # the same prompts as the level's first ones, salted: their prefill runs in full and
    # leaves nothing in the prefix cache for the measured requests
    assert [b["prompt"] for b in short[1:2]] == [measured[0]["prompt"]]
    level3 = {str(b["prompt"]) for b in measured[2:]}  # sent 3 at a time: arrival order varies
    assert len({str(b["prompt"]) for b in short[2:]} & level3) == 3
    salts = [b.get("cache_salt") for b in short[1:]]
    assert all(salts) and len(set(salts)) == 2 and not any("cache_salt" in b for b in measured)
    # the measured numbers count only the measured requests
    assert [(r["concurrency"], r["completed"], r["total_output_tokens"]) for r in doc["runs"]] == [(1, 2, 48), (3, 6, 144)]
    assert doc["warm_up"].startswith("one unmeasured round per level")


def test_the_warm_up_salt_is_one_the_released_vllm_accepts():
    """vLLM 0.33.0 refuses a cache_salt over 128 characters or with ``@ / \\`` or NUL
    (entrypoints/generate/base/protocol.py of the released wheel, read here); 0.21.0 asks
    only for a non-empty string."""
    import re

    from launcher.bench import runner, workload
    from launcher.recipe import BenchWorkload
    from tests.integration.patch_trees import pristine

    src = (pristine("0.33.0", "site-packages") / "vllm/entrypoints/generate/base/protocol.py").read_text()
    forbidden = eval(re.search(r"_CACHE_SALT_FORBIDDEN_CHARS = frozenset\((.+)\)", src).group(1))  # a literal
    limit = int(re.search(r"_MAX_CACHE_SALT_LENGTH = (\d+)", src).group(1))
    assert "@" in forbidden and limit == 128
    w = BenchWorkload(name="a/b@c " + "x" * 200, dataset="random", input_len=8, output_len=8, concurrency=[1])
    run = workload.Run(w, 22, 88)
    salts = {runner.warm_up_salt(run) for _ in range(3)}
    assert len(salts) == 3  # each round its own
    assert all(0 < len(s) <= limit and not set(s) & set(forbidden) for s in salts)


def test_a_missing_baseline_result_is_named_before_the_run(tmp_path):
    with StubServer(Behaviour(drafter=True)) as server:
        proc = _bench(tmp_path, server, "--compare-without-drafter", "--baseline-result", "earlier.json")
    assert proc.returncode == 2 and "--baseline-result earlier.json: not a readable result JSON" in proc.stderr
    assert server.completions == 0


@pytest.mark.parametrize("value", ["0", "-1", "nan"])
def test_timeout_must_be_positive(value, tmp_path):
    with StubServer(Behaviour()) as server:
        proc = _bench(tmp_path, server, f"--timeout={value}")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"--timeout {float(value):g}: seconds per request must be more than 0" in proc.stderr
    assert server.completions == 0


def test_timeout_bounds_the_whole_request_not_each_read():
    """A server sending a keep-alive comment every 50 ms never trips a per-read timeout of 0.5 s."""
    with StubServer(Behaviour(keepalives=200, keepalive_s=0.05)) as server:
        res = client.one_request(Target(server.url, "gemma4"), "Hello", max_tokens=4, temperature=0.0, seed=0,
                                 ignore_eos=True, timeout=0.5)
    assert not res.ok
    assert "no complete answer within --timeout 0.5 s" in res.error


@pytest.mark.parametrize("behaviour, message", [
    (Behaviour(models_body=[{"id": "gemma4"}]), "/v1/models answered [{\"id\": \"gemma4\"}], not an OpenAI model list"),
    (Behaviour(event_form="list"), "an SSE event is not a JSON object"),
    (Behaviour(event_form="string-choices"), "an SSE event's choices are not a list of objects"),
], ids=["models-list", "events-lists", "choices-strings"])
def test_wrongly_shaped_json_is_a_clear_error(behaviour, message, tmp_path):
    with StubServer(behaviour) as server:
        proc = _bench(tmp_path, server)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and message in proc.stderr


def test_nan_or_inf_counters_do_not_raise():
    text = ("vllm:spec_decode_num_drafts_total{engine=\"0\"} NaN\n"
            "vllm:spec_decode_num_draft_tokens_total{engine=\"0\"} +Inf\n"
            "vllm:spec_decode_num_accepted_tokens_total{engine=\"0\"} 3.0\n")
    after = ("vllm:spec_decode_num_drafts_total{engine=\"0\"} 4.0\n"
             "vllm:spec_decode_num_draft_tokens_total{engine=\"0\"} NaN\n"
             "vllm:spec_decode_num_accepted_tokens_total{engine=\"0\"} 9.0\n")
    before, later = metrics.parse(text), metrics.parse(after)
    assert before is not None and later is not None  # the counters are there ...
    result = metrics.acceptance(before, later)
    assert result["acceptance_rate_pct"] is None  # ... but say nothing about acceptance
    assert metrics.acceptance(later, metrics.parse(after.replace("NaN", "8.0")))["draft_tokens"] == 8


def test_result_uses_vllm_bench_keys_and_progress_is_shown(tmp_path):
    """Issue 29.5: flat keys as `vllm bench serve --save-result` writes them; progress while it runs."""
    with StubServer(Behaviour(ttft_s=0.02)) as server:
        proc = _bench(tmp_path, server, "--out", "r.json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "r.json").read_text())
    for run in doc["runs"]:
        for key in ("duration", "completed", "total_input_tokens", "total_output_tokens", "request_throughput",
                    "output_throughput", "total_token_throughput", "max_concurrency"):
            assert isinstance(run[key], (int, float)), key
        for name in ("ttft", "tpot", "itl", "e2el"):
            for stat in ("mean", "median", "std", "p50", "p99"):
                assert isinstance(run[f"{stat}_{name}_ms"], float), f"{stat}_{name}_ms"
        assert run["total_token_throughput"] * run["duration"] == pytest.approx(
            run["total_input_tokens"] + run["total_output_tokens"])
        assert run["mean_ttft_ms"] >= 20.0 and run["mean_e2el_ms"] > run["mean_ttft_ms"]
        assert run["p99_tpot_ms"] >= run["median_tpot_ms"] and run["std_ttft_ms"] >= 0.0
        assert "ttft_ms" not in run
    # Not a terminal here: the progress comes as plain lines on stderr, one per run.
    assert "run 1/2 short c=1: 2 requests" in proc.stderr and "run 2/2 short c=3: 6 requests" in proc.stderr
    assert "TTFT mean " in proc.stdout and " / p99 " in proc.stdout


@pytest.fixture
def full_disk(tmp_path):
    """A real 64 KiB tmpfs, filled up (mounting needs CAP_SYS_ADMIN); unmounted afterwards."""
    where = tmp_path / "full"
    where.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)],
                         capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()}")
    try:
        with open(where / "filler", "wb") as fh:
            try:
                fh.write(b"x" * (1 << 20))
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)


def test_a_full_disk_at_the_end_keeps_the_result_and_leaves_no_partial_file(tmp_path, full_disk):
    """Issue 55.9: the run finished, then the write failed: a traceback, no JSON, a 0-byte .partial."""
    out = full_disk / "r.json"
    with StubServer(Behaviour()) as server:
        proc = _bench(tmp_path, server, "--out", str(out))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"writing --out {out} failed (No space left on device)" in proc.stderr
    assert sorted(p.name for p in full_disk.iterdir()) == ["filler"]  # no partial file, no half JSON
    printed = json.loads(proc.stdout[proc.stdout.index("\n{") + 1:proc.stdout.rindex("}") + 1])
    # both levels of the small recipe, each measured (what a lost result would have held)
    assert [r["concurrency"] for r in printed["runs"]] == [1, 3]
    assert all(r["completed"] > 0 and r["mean_ttft_ms"] is not None for r in printed["runs"])
    assert server.completions > 0


def test_out_in_proc_is_refused_before_any_request(tmp_path):
    with StubServer(Behaviour()) as server:
        proc = _bench(tmp_path, server, "--out", "/proc/x.json")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--out /proc/x.json cannot be written" in proc.stderr and "Traceback" not in proc.stderr
    assert server.completions == 0


@pytest.mark.parametrize("behaviour, said", [
    (Behaviour(cut_after=1, misbehave_from=2), "the stream was cut off before data: [DONE] (1 of"),
    (Behaviour(short_by=3, misbehave_from=2), "tokens (with ignore_eos)"),
], ids=["cut-after-one-chunk", "short-with-ignore-eos"])
def test_a_stream_that_does_not_finish_is_a_failed_request(behaviour, said, tmp_path):
    """Issue 55.7: one SSE chunk, then a closed socket, counted as a finished request (rc 0, 4 of 1,024 tokens).

    The server answers the bench's first request whole, then every stream misbehaves."""
    with StubServer(behaviour) as server:
        proc = _bench(tmp_path, server, "--out", "r.json")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "every request failed" in proc.stderr
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["runs"][0]["completed"] == 0 and doc["runs"][0]["total_output_tokens"] == 0
    assert any(said in e for e in doc["runs"][0]["errors"]), doc["runs"][0]["errors"]


def test_a_first_request_cut_off_is_refused_before_the_runs(tmp_path):
    with StubServer(Behaviour(cut_after=1)) as server:
        proc = _bench(tmp_path, server, "--out", "r.json")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "failed: the stream was cut off before data: [DONE] (1 of 8 tokens)" in proc.stderr
    assert server.completions == 1 and not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("flag", ["--url", "--baseline-url"])
def test_a_key_written_into_the_url_is_refused_and_never_printed(flag, tmp_path):
    """A key in ``http://user:KEY@host`` was echoed by the 'no server answers' error."""
    secret = "sk-url-secret-4242"
    recipe = small_recipe(tmp_path)  # refused before the recipe matters
    args = ["bench", "--recipe", str(recipe), "--out", str(tmp_path / "r.json")]
    if flag == "--url":
        args += ["--url", f"http://user:{secret}@127.0.0.1:9"]
    else:
        args += ["--url", "http://127.0.0.1:9", "--compare-without-drafter", "--baseline-url", f"http://:{secret}@127.0.0.1:9"]
    proc = launcher(args, tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert secret not in proc.stdout + proc.stderr
    assert f"{flag} http://***@127.0.0.1:9 carries a user name or key" in proc.stderr


@pytest.mark.parametrize("url, said", [
    ("not-a-url", "--url 'not-a-url' is not an http:// or https:// URL"),
    ("file:///etc/passwd", "--url 'file:///etc/passwd' is not an http:// or https:// URL"),
    ("http://127.0.0.1:99999", "(Port out of range"),
])
def test_a_url_that_is_no_http_server_is_one_error(url, said, tmp_path):
    """``not-a-url`` was a ValueError traceback; ``file://`` was opened as a server's answers."""
    proc = launcher(["bench", "--recipe", str(small_recipe(tmp_path)), "--url", url, "--out", str(tmp_path / "r.json")],
                    tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and said in proc.stderr
    assert not (tmp_path / "r.json").exists()
