"""fullsize_serve.py's orchestration and fullsize_report.py's document, with stand-ins for what needs a GPU.

Stand-ins: the memory blocker (prints what mem_blocker.py prints) and the
launcher (a tiny OpenAI-style server that logs what vLLM 0.21.0 logs and
answers /health, /metrics, /v1/models and streamed /v1/completions). Real:
the harness's process handling, the recipe copy, ``launcher bench`` with its
built-in client against the stand-in, the log and /metrics parsing, the
verdict, and the report built from the records it wrote.
"""

from __future__ import annotations

import json
import shlex
import sys
import textwrap
from pathlib import Path

import pytest

from tests.unit import stand_in_openai

GPU_DIR = Path(__file__).resolve().parents[1] / "gpu"
sys.path.insert(0, str(GPU_DIR))

import fullsize_report as fr  # noqa: E402
import fullsize_serve as fsv  # noqa: E402
import fullsize_shapes as fs  # noqa: E402
import memfit  # noqa: E402
import roofline  # noqa: E402

DEVICE_TOTAL = 85_031_714_816


# The rtx5090 profile as the recipe ships it (the runs read it the same way).
_SHIPPED = fsv.profile_settings("gemma4-moe-dflash", "rtx5090")
FRACTION, MAX_SEQS = _SHIPPED["gpu_memory_utilization"], _SHIPPED["max_num_seqs"]
MAX = str(MAX_SEQS)

BLOCKER = textwrap.dedent(f"""\
    import json, sys, time
    leave = int(sys.argv[sys.argv.index("--leave-free") + 1])
    print(json.dumps({{"event": "start", "free": {DEVICE_TOTAL} - 600 * 2**20, "total": {DEVICE_TOTAL},
                      "device": "Stand-in H100"}}), flush=True)
    print(json.dumps({{"event": "holding", "held": {DEVICE_TOTAL} - 600 * 2**20 - leave, "free": leave,
                      "total": {DEVICE_TOTAL}}}), flush=True)
    while True:
        time.sleep(0.2)
""")

SERVER = textwrap.dedent("""\
    import json, os, sys, threading
    sys.path.insert(0, STAND_IN_DIR)
    import stand_in_openai
    argv = sys.argv[1:]
    port = int(argv[argv.index("--port") + 1])
    keep = ("VLLM_LOGGING_LEVEL", "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS")
    json.dump({"argv": argv, "env": {k: os.environ.get(k) for k in keep}}, open(os.environ["FAKE_RECORD"], "w"))
    print("(EngineCore_DP0 pid=2) INFO Model loading took 18.34 GiB memory and 20.0 seconds", flush=True)
    print("(EngineCore_DP0 pid=2) INFO Estimated CUDA graph memory: 0.61 GiB total", flush=True)
    print("(EngineCore_DP0 pid=2) INFO Available KV cache memory: 3.21 GiB", flush=True)
    print("(EngineCore_DP0 pid=2) INFO GPU KV cache size: 140,352 tokens", flush=True)
    print("(EngineCore_DP0 pid=2) INFO Maximum concurrency for 131,072 tokens per request: 1.07x", flush=True)
    if os.environ.get("FAKE_FAIL"):
        print("ValueError: Free memory on device (1.0/79.19 GiB) on startup is less than desired GPU memory "
              "utilization", flush=True)
        sys.exit(1)
    print("(EngineCore_DP0 pid=2) INFO Graph capturing finished in 21 secs, took 0.58 GiB", flush=True)
    print("(EngineCore_DP0 pid=2) DEBUG Actual usage is 18.34 GiB for weight, 2.1 GiB for peak activation, "
          "0.35 GiB for non-torch memory, and 0.58 GiB for CUDAGraph memory.", flush=True)
    done = [0]
    lock = threading.Lock()
    preempt = float(os.environ.get("FAKE_PREEMPTIONS", "0"))
    class H(stand_in_openai.Handler):
        def metrics(self):
            with lock:
                n = done[0]
            return (f'vllm:num_preemptions_total{{engine="0"}} {preempt if n else 0.0}\\n'
                    f'vllm:request_success_total{{engine="0",finished_reason="length"}} {float(n)}\\n'
                    f'vllm:num_requests_running{{engine="0"}} 3.0\\n'
                    f'vllm:kv_cache_usage_perc{{engine="0"}} 0.125\\n')
        def do_POST(self):
            body = self.read_body()
            self.stream(3, {"prompt_tokens": 1024, "completion_tokens": body["max_tokens"]})
            with lock:
                done[0] += 1
    stand_in_openai.serve(port, H, 128)  # 22 clients connect at once
""").replace("STAND_IN_DIR", repr(stand_in_openai.HERE))


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(tmp: Path, label: str, *extra: str, env: dict | None = None, monkeypatch=None) -> dict:
    (tmp / "blocker.py").write_text(BLOCKER)
    (tmp / "server.py").write_text(SERVER)
    record_file = tmp / f"{label}.argv.json"
    monkeypatch.setenv("FAKE_RECORD", str(record_file))
    monkeypatch.setenv("VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS", "0")  # must not reach the server
    for k, v in (env or {}).items():
        monkeypatch.setenv(k, v)
    argv = ["--label", label, "--out", str(tmp / "raw"), "--profile", "rtx5090",
            "--launcher", shlex.join([sys.executable, str(tmp / "server.py")]), "--model", str(tmp / "m"),
            "--blocker", shlex.join([sys.executable, str(tmp / "blocker.py")]), "--port", str(_free_port()),
            "--deadline-s", "120", "--start-timeout-s", "30", "--concurrency", "1,max",
            "--vllm-arg=--mm-processor-cache-gb", "--vllm-arg=0", *extra]
    code = fsv.main(argv)
    record = json.loads((tmp / "raw" / f"{label}.json").read_text())
    record["_code"] = code
    record["_server"] = json.loads(record_file.read_text()) if record_file.exists() else None
    return record


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    tmp = tmp_path_factory.mktemp("fullsize-serve")
    try:
        out = {"dflash": _run(tmp, "rtx5090-dflash", "--drafter", str(tmp / "d"), "--debug-log",
                                "--series-hash", "cd" * 32, monkeypatch=mp),
               "nodrafter": _run(tmp, "rtx5090-nodrafter", "--no-drafter", "--min-requests", "12", monkeypatch=mp,
                                 env={"FAKE_PREEMPTIONS": "2"})}
    finally:
        mp.undo()
    out["dir"] = tmp / "raw"
    return out


def test_server_gets_the_scaled_fraction_and_the_launcher_options(runs):
    rec = runs["dflash"]
    argv = rec["_server"]["argv"]
    f = memfit.scaled_fraction(memfit.CARDS["rtx5090"], FRACTION, DEVICE_TOTAL)
    assert rec["plan"]["scaled_fraction"] == f
    assert argv[argv.index("--profile") + 1] == "rtx5090" and argv[argv.index("--recipe") + 1] == "gemma4-moe-dflash"
    assert f"serve.gpu_memory_utilization={f}" in argv
    assert "--drafter" in argv and "drafter=null" not in argv
    assert argv[argv.index("--"):] == ["--", "--mm-processor-cache-gb", "0"]
    assert rec["_server"]["env"] == {"VLLM_LOGGING_LEVEL": "DEBUG", "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS": None}
    assert "drafter=null" in runs["nodrafter"]["_server"]["argv"]
    assert runs["nodrafter"]["_server"]["env"]["VLLM_LOGGING_LEVEL"] is None  # speed runs log at INFO


def test_a_served_run_records_memory_bench_and_verdict(runs):
    rec = runs["dflash"]
    assert rec["_code"] == 0 and rec["started"] and rec["fits"], rec["why"]
    assert rec["emulation"].startswith("emulation")
    assert rec["series"] == "cd" * 32 and runs["nodrafter"]["series"] is None
    assert rec["blocker"]["free_after_bytes"] == memfit.CARDS["rtx5090"].total_bytes
    assert (rec["log"]["weights_gib"], rec["log"]["activation_peak_gib"], rec["log"]["graph_actual_gib"]) == \
        (18.34, 2.1, 0.58)
    assert rec["derived"]["kv_tokens_per_max_model_len"] == round(140352 / 131072, 3)
    assert set(rec["bench"]) == {"1", MAX}
    assert rec["bench"][MAX]["successful"] == 4 * MAX_SEQS and rec["bench"]["1"]["successful"] == 4
    assert rec["bench"][MAX]["output_tok_s"] > 0
    assert rec["metrics_delta"]["preemptions"] == 0 and rec["metrics_delta"]["requests_finished"] >= 4 + 4 * MAX_SEQS
    assert rec["metrics_peaks"]["requests_running"] == 3.0
    assert "Model loading took" in (runs["dir"] / "rtx5090-dflash.server-excerpt.log").read_text()
    import yaml

    copy = yaml.safe_load((runs["dir"] / "gemma4-moe-dflash-bench.yaml").read_text())
    assert [(w["dataset"], w["concurrency"]) for w in copy["bench"]["workloads"]] == [("random", [1, "max"])]


def test_min_requests_reaches_launcher_bench(runs):
    # 4 requests a stream at concurrency 1 unless asked for more (the frozen model's servers ask 32)
    assert runs["dflash"]["bench"]["1"]["successful"] == 4
    assert runs["nodrafter"]["bench"]["1"]["successful"] == 12


def test_the_frozen_models_servers_ask_the_bars_request_count(tmp_path):
    import speedup_frozen

    args = type("A", (), {"recipe": "gemma4-moe-dflash", "launcher": "x", "model": tmp_path, "drafter": tmp_path,
                          "out": tmp_path, "series_hash": None, "vllm_arg": [],
                          "set": ["serve.max_model_len=16384"]})()
    argv = speedup_frozen.serve_argv(args, 3, 300)
    # a context the profile did not start with reaches every server's launcher, after the K
    sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    assert sets == ["drafter.num_speculative_tokens=3", "serve.max_model_len=16384"]
    assert argv[argv.index("--min-requests") + 1] == str(speedup_frozen.bars.get("speedup_curve", "min_requests"))
    # A drafter server on 0.33.0 took 431 s to start: no start limit of its own cuts it, the
    # server's deadline less the bench's reserve does
    assert "--start-timeout-s" not in argv
    assert argv[argv.index("--bench-reserve-s") + 1] == str(speedup_frozen.BENCH_RESERVE_S)


def test_a_server_waits_until_its_deadline_less_the_bench_reserve():
    args = type("A", (), {"bench_reserve_s": 90.0, "start_timeout_s": None})()
    deadline = fsv.now() + 540
    assert fsv.start_by(args, deadline) == deadline - 90  # 450 s: past the 420 s that cut a 431 s start
    args.start_timeout_s = 30.0
    assert fsv.start_by(args, deadline) <= fsv.now() + 30  # a limit of its own, where given, ends it sooner


def test_preemptions_fail_the_fit(runs):
    rec = runs["nodrafter"]
    assert rec["started"] and not rec["fits"]
    assert rec["why"] == ["2 preemptions"]


def test_a_server_that_cannot_start_is_recorded(tmp_path, monkeypatch):
    rec = _run(tmp_path, "fail", "--no-drafter", env={"FAKE_FAIL": "1"}, monkeypatch=monkeypatch)
    assert rec["_code"] == 1 and not rec["started"] and not rec["fits"]
    assert rec["log"]["failures"] == ["free_memory_check"]
    assert rec["why"][0] == "server exited with code 1 before it was ready"


def test_launcher_must_not_carry_its_own_separator(tmp_path):
    with pytest.raises(SystemExit):
        fsv.main(["--label", "x", "--out", str(tmp_path), "--profile", "rtx5090", "--launcher", "launcher serve --",
                  "--model", "m", "--no-drafter"])


# ----------------------------------------------------------------- the report


def _shapes() -> dict:
    return {"target_config": fs.target_config(), "drafter_config": fs.drafter_config(),
            "params_total": 25_805_936_206, "params_text": 25_233_141_790, "params_vision": 572_794_416,
            "params_active": 3_822_530_590, "target": {"bytes": 18_782_360_732, "bytes_by_class": {"experts": 1}},
            "drafter": {"bytes": 859_000_000}, "sources": fs.SOURCES}


def _roof() -> dict:
    terms = {"experts": 0.8e9, "attention": 2.2e9, "lm_head": 1.48e9, "kv_cache": 0.2e9}
    b16 = {"experts": 8e9, "attention": 2.2e9, "lm_head": 1.48e9, "kv_cache": 3.2e9}
    return {"context": 1024, "bytes_per_token": 5_600_000_000, "decode_b1": {**terms, "total": 5.6e9},
            "decode_b16_terms": {**b16, "total": 16.8e9}, "decode_b16_per_token": 1_050_000_000,
            "dflash_step_b1": {"total": 15.7e9}, "expected_experts": {"1": 8}}


def test_report_has_issue_27s_fields(runs):
    records = [json.loads(p.read_text()) for p in sorted(runs["dir"].glob("*.json")) if ".bench." not in p.name]
    six = {"device": "NVIDIA H200, 143771 MiB, 580", "steps_ms": {"nvfp4": {"decode": {"1": {"decode_30": 5.0}}}}}
    doc = fr.build(_shapes(), records=records, roof=_roof(), bandwidth={"copy_gbps": 3000.0, "read_gbps": 3300.0},
                   six_layer=six, gpu="NVIDIA H100 80GB HBM3, 81559 MiB, 580")
    assert {"model", "gpu", "profiles", "bench", "roofline", "extrapolation_check", "projection"} <= set(doc)
    assert {"params_total", "params_active", "shapes"} <= set(doc["model"])
    p = doc["profiles"]["rtx5090"]
    assert p["fits"] is True and p["preemptions"] == 0
    assert (p["weights_gib"], p["graph_gib"], p["kv_cache_tokens"]) == (18.34, 0.58, 140352)
    assert p["memory_budget_gib"] == round(33_668_857_856 * FRACTION / 2**30, 3)
    assert doc["profiles_without_drafter"]["rtx5090"]["fits"] is False
    assert "Series (the patched site's stamp, per run record): cdcdcdcd, not recorded in 1 of 2; **0 of 2 on a current series**." in \
        fr.markdown(doc)
    for key in ("no_drafter", "dflash"):
        assert set(doc["bench"][key]) == {"1", MAX}
        assert set(doc["bench"][key][MAX]) >= {"output_tok_s", "ttft_ms", "tpot_ms", "successful"}
    tpot = doc["bench"]["no_drafter"]["1"]["tpot_ms"]
    r = doc["roofline"]
    assert r["bandwidth_gbps"] == 3000.0 and r["bytes_per_token"] == 5_600_000_000
    assert r["achieved_fraction"] == round(5.6e9 / (tpot / 1000) / 3000e9, 4)
    assert (r["largest_share_b1"], r["largest_share_b16"]) == ("attention", "experts")
    assert doc["knobs"]["b16"].startswith("the MoE backend")
    x = doc["extrapolation_check"]
    assert x["rows"]["1"]["ratio"] == round(tpot / 5.0, 3) and x["same_device_kind"] is False
    proj = doc["projection"]
    assert proj["decode_c1"]["rtx5090"]["projection"] is True
    assert proj["decode_c1"]["rtx5090"]["tok_s"] == round(r["achieved_fraction"] * 1790e9 / 5.6e9, 1)
    assert proj["dflash_c1_by_acceptance"]["gb10"]["4"] == round(4 * r["achieved_fraction"] * 273e9 / 15.7e9, 1)
    md = fr.markdown(doc)
    assert "| rtx5090 | rtx5090-dflash |" in md and "DFlash's overhead" in md and "Projections" in md


def test_report_cli_survives_missing_inputs(tmp_path):
    (tmp_path / "shapes.json").write_text(json.dumps(_shapes()))
    assert fr.main(["--shapes", str(tmp_path / "shapes.json"), "--runs", str(tmp_path / "none"),
                    "--json", str(tmp_path / "f.json"), "--md", str(tmp_path / "f.md")]) == 0
    doc = json.loads((tmp_path / "f.json").read_text())
    assert doc["profiles"] == {} and doc["roofline"] is None and doc["projection"] is None


def test_roofline_projection_labels_match_the_module():
    assert set(roofline.DEVICES_GBPS) == {"rtx5090", "gb10"}


# ----------------------------------------------------------------- remote.sh wiring

STUB_PY = textwrap.dedent("""\
    #!{python}
    import json, os, sys
    args = sys.argv[1:]
    with open(os.environ["STUB_LOG"], "a") as fh:
        fh.write(json.dumps(args) + "\\n")
    if args[:4] == ["-m", "launcher", "serve", "--help"]:
        print("  --test-gpu   plan on a Hopper test GPU" if os.environ.get("STUB_TEST_GPU") else "  --force")
    if args[:2] == ["tests/gpu/staging/sites.py", "stamp"]:  # remote.sh series_hash: the site's stamp
        print("ab" * 32)
""")


@pytest.mark.parametrize("verb,test_gpu", [("fit", True), ("full-bench", False)])
def test_remote_sh_passes_the_harness_what_it_needs(tmp_path, verb, test_gpu):
    """remote.sh fit / full-bench with a stand-in interpreter: the arguments fullsize_serve.py gets."""
    import os
    import subprocess

    repo = GPU_DIR.parents[1]
    site, patched, work = tmp_path / "site", tmp_path / "site-patched", tmp_path / "work"
    (site / "vllm" / "vllm_flash_attn").mkdir(parents=True)
    (site / "vllm" / "vllm_flash_attn" / "_vllm_fa2_C.abi3.so").write_text("")
    (site / ".bundle-installed").write_text("")
    (patched / "vllm").mkdir(parents=True)
    (work / "fullsize-raw").mkdir(parents=True)
    (work / "fullsize-raw" / "fullsize-shapes.json").write_text("{}")
    stub = tmp_path / "py"
    stub.write_text(STUB_PY.format(python=sys.executable))
    stub.chmod(0o755)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "nvidia-smi").write_text("#!/bin/sh\necho 'NVIDIA H200, 143771 MiB, 580'\n")
    (bindir / "nvidia-smi").chmod(0o755)
    env = {**os.environ, "PY": str(stub), "SITE": str(site), "SITE_PATCHED": str(patched), "WORK": str(work),
           "OUT": str(tmp_path / "out"), "BUNDLE_DIR": str(tmp_path / "bundle"), "MODELS_FULL": "/m",
           "STUB_LOG": str(tmp_path / "calls.jsonl"), "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}
    if test_gpu:
        env["STUB_TEST_GPU"] = "1"
    proc = subprocess.run(["bash", "tests/gpu/remote.sh", verb], cwd=repo, env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    calls = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    serve = next(c for c in calls if c and c[0] == "tests/gpu/runs/fullsize_serve.py")
    opt = {serve[i]: serve[i + 1] for i in range(1, len(serve) - 1) if serve[i].startswith("--")
           and not serve[i].startswith("--vllm-arg")}
    assert opt["--profile"] == "rtx5090"
    assert opt["--label"] == ("rtx5090-dflash-fit" if verb == "fit" else "rtx5090-dflash")
    assert opt["--drafter"] == "/m/dflash-26b-a4b" and opt["--model"] == "/m/gemma4-26b-a4b-nvfp4"
    assert opt["--concurrency"] == ("max" if verb == "fit" else "1,4,16,max")
    # The record names the series the patched site was stamped with.
    stamp_call = next(c for c in calls if c[:2] == ["tests/gpu/staging/sites.py", "stamp"])
    assert stamp_call[2] == str(patched) and opt["--series-hash"] == "ab" * 32
    assert [a for a in serve if a.startswith("--vllm-arg")] == [
        "--vllm-arg=--mm-processor-cache-gb", "--vllm-arg=0", "--vllm-arg=--attention-config",
        '--vllm-arg={"flash_attn_version": 2}']
    launcher = shlex.split(opt["--launcher"])
    assert launcher[:4] == [str(stub), "-m", "launcher", "serve"]
    assert ("--test-gpu" in launcher) == test_gpu and ("--force" in launcher) != test_gpu
    assert launcher[-2:] == ["--set", "intent.sampler=pytorch"]
    assert 400 < float(opt["--deadline-s"]) <= 555
    assert ("--debug-log" in serve) == (verb == "fit")
    assert any(c and c[0] == "tests/gpu/reports/fullsize_report.py" for c in calls)
    assert (tmp_path / "out" / "fullsize-raw.tar.gz").is_file()


def test_a_fit_run_gives_the_memory_a_speed_run_the_rows():
    def rec(label, bench, activation):
        return {"label": label, "profile": "rtx5090", "drafter": "/d", "fits": True, "why": [], "started": True,
                "log": {"weights_gib": 18.3, "activation_peak_gib": activation}, "plan": {}, "derived": {},
                "bench": {c: {"output_tok_s": 1.0, "tpot_ms": 2.0, "ttft_ms": 3.0, "successful": 4, "requests": 4}
                          for c in bench}}

    shorter = rec("rtx5090-dflash-set", ["1", "4", "22"], None)
    shorter["extra_sets"] = ["serve.max_model_len=65536"]
    records = [rec("rtx5090-dflash-fit", ["22"], 2.1), rec("rtx5090-dflash", ["1", "22"], None), shorter]
    for order in (records, records[::-1]):
        doc = fr.build(_shapes(), records=order, roof=None, bandwidth=None, six_layer=None, gpu=None)
        assert doc["profiles"]["rtx5090"]["run"] == "rtx5090-dflash-fit"
        assert doc["profiles"]["rtx5090"]["activation_peak_gib"] == 2.1
        assert set(doc["bench"]["dflash"]) == {"1", "22"}
        assert doc["bench"]["runs"]["dflash"] == {"run": "rtx5090-dflash", "extra_sets": []}
    # Without a run of the recipe as shipped, the changed one gives the rows and says so.
    doc = fr.build(_shapes(), records=[records[0], shorter], roof=None, bandwidth=None, six_layer=None, gpu=None)
    assert set(doc["bench"]["dflash"]) == {"1", "4", "22"}
    assert doc["bench"]["runs"]["dflash"]["extra_sets"] == ["serve.max_model_len=65536"]
    assert doc["profiles"]["rtx5090"]["run"] == "rtx5090-dflash-fit"


def _speed_record(label, drafter, tpot):
    return {"label": label, "profile": "rtx5090", "drafter": drafter, "fits": True, "why": [], "started": True,
            "log": {"weights_gib": 18.8}, "plan": {}, "derived": {},
            "bench": {c: {"output_tok_s": 1000 / t, "tpot_ms": t, "ttft_ms": 50.0, "successful": 4, "requests": 4}
                      for c, t in tpot.items()}}


def test_dflash_projection_at_a_measured_acceptance_length():
    records = [_speed_record("rtx5090-nodrafter", None, {"1": 4.0, "16": 9.0}),
               _speed_record("rtx5090-dflash", "/d", {"1": 10.0, "16": 20.0})]
    roof = {**_roof(), "dflash_step_b1": {"total": 15.0e9}}
    accepted = {"run": "trained-capture", "vllm": "0.21.0", "quantization": "bf16", "drafter_sha256": "d46b",
                "concurrency": [1, 8], "mean_acceptance_length_vllm": 3.0, "mean_acceptance_length_reference": 2.9}
    doc = fr.build(_shapes(), records=records, roof=roof, bandwidth={"copy_gbps": 3000.0, "read_gbps": 3000.0},
                   six_layer=None, gpu=None, accepted=accepted)
    a = doc["projection"]["dflash_at_measured_acceptance"]
    assert a["acceptance_length"] == 3.0 and a["source"]["run"] == "trained-capture"
    # Three tokens out of each 10 ms step, against 4 ms a token without the drafter: 1.2 x.
    assert a["by_concurrency"]["1"] == {"dflash_step_ms": 10.0, "no_drafter_tpot_ms": 4.0,
                                        "projected_tpot_ms": 3.333, "projected_speedup": 1.2}
    assert a["by_concurrency"]["16"]["projected_speedup"] == 1.35
    eff = doc["roofline"]["achieved_fraction"]
    assert a["tok_s_c1_at_bandwidth"]["rtx5090"] == round(3.0 * eff * 1790e9 / 15.0e9, 1)
    assert "DFlash at the measured acceptance length 3.00" in fr.markdown(doc)
    assert "Series (the patched site's stamp, per run record): not recorded in 2 of 2; **0 of 2 on a current series**." in fr.markdown(doc)
    assert f"at batch 1: attention; what moves it: {fr.KNOBS['attention']}" in fr.markdown(doc)
    # Without a bandwidth the step-time rows stand alone; without the no-drafter rows nothing does.
    no_bw = fr.build(_shapes(), records=records, roof=roof, bandwidth=None, six_layer=None, gpu=None,
                     accepted=accepted)
    assert set(no_bw["projection"]) == {"dflash_at_measured_acceptance"}
    assert "tok_s_c1_at_bandwidth" not in no_bw["projection"]["dflash_at_measured_acceptance"]
    assert "projected speed-up" in fr.markdown(no_bw)
    alone = fr.build(_shapes(), records=records[1:], roof=roof, bandwidth=None, six_layer=None, gpu=None,
                     accepted=accepted)
    assert alone["projection"] is None


def test_earlier_runs_are_listed_with_their_settings(tmp_path):
    (tmp_path / "runs").mkdir()
    attempt = {"label": "rtx5090-dflash", "profile": "rtx5090", "drafter": "/d", "started": False, "fits": False,
               "why": ["the server did not start"], "profile_settings": {"max_model_len": 65536,
                                                                          "gpu_memory_utilization": 0.85,
                                                                          "max_num_seqs": 22},
               "blocker": {"device": "NVIDIA H200"}, "plan": {}, "derived": {},
               "log": {"activation_peak_gib": 2.52, "available_kv_gib": 4.17, "estimated_max_len": 63168}}
    (tmp_path / "runs" / "rtx5090-dflash-2-65536.json").write_text(json.dumps(attempt))
    # The excerpt beside it (same stem) gives the token budget the record lacks.
    (tmp_path / "runs" / "rtx5090-dflash-2-65536.server-excerpt.log").write_text(
        "Chunked prefill is enabled with max_num_batched_tokens=8192.\n"
        "Compiling a graph for compile range (1, 8192) takes 30.40 s\n")
    attempts = fr.load_records(tmp_path / "runs")
    doc = fr.build(_shapes(), records=[], roof=None, bandwidth=None, six_layer=None, gpu=None, attempts=attempts)
    (row,) = doc["profile_attempts"]
    assert row["record_file"] == "rtx5090-dflash-2-65536.json" and row["device"] == "NVIDIA H200"
    assert row["settings"] == {"max_model_len": 65536, "gpu_memory_utilization": 0.85, "max_num_seqs": 22,
                               "max_num_batched_tokens": 8192}
    assert (row["estimated_max_model_len"], row["torch_compile"], row["fits"]) == (63168, "cold", False)
    assert "| rtx5090 | rtx5090-dflash-2-65536.json | NVIDIA H200 | 65536 | 0.85 | 22 | 8192 | cold |" in \
        fr.markdown(doc)


def test_the_acceptance_record_is_named_by_run_and_drafter(tmp_path):
    path = tmp_path / "acceptance.json"
    path.write_text(json.dumps([{"run": "a", "drafter_sha256": "d46b01"}, {"run": "a", "drafter_sha256": "0d50"}]))
    assert fr.accepted_record(path, "a", "d46b")["drafter_sha256"] == "d46b01"
    with pytest.raises(SystemExit, match="2 records of run 'a'"):
        fr.accepted_record(path, "a", "")


def test_a_capture_run_joined_to_a_row_is_found_with_the_rows_release_and_drafter(tmp_path):
    path = tmp_path / "acceptance.json"
    path.write_text(json.dumps([
        {"run": "a", "vllm": "0.21.0", "quantization": "bf16", "drafter_sha256": "4f7c01",
         "capture_run": {"run": "a-capture", "concurrency": [1, 8, 17], "mean_acceptance_length_vllm": 4.01}},
        {"run": "a", "vllm": "0.21.0", "quantization": "bf16", "drafter_sha256": "d46b01",
         "capture_run": {"run": "a-capture", "mean_acceptance_length_vllm": 3.05}}]))
    got = fr.accepted_record(path, "a-capture", "4f7c")
    assert (got["vllm"], got["drafter_sha256"], got["mean_acceptance_length_vllm"]) == ("0.21.0", "4f7c01", 4.01)
    assert got["concurrency"] == [1, 8, 17]
    with pytest.raises(SystemExit, match="2 records of run 'a-capture'"):
        fr.accepted_record(path, "a-capture", "")


def test_an_earlier_run_with_other_settings_is_kept_as_an_attempt(tmp_path):
    settings = {"max_model_len": 49152, "max_num_seqs": 16}
    old = {"label": "rtx5090-dflash", "profile": "rtx5090", "profile_settings": {**settings, "max_num_seqs": 22},
           "extra_sets": []}
    (tmp_path / "rtx5090-dflash.json").write_text(json.dumps(old))
    (tmp_path / "rtx5090-dflash.server-excerpt.log").write_text("max_num_batched_tokens=8192\n")
    (tmp_path / "rtx5090-dflash.bench.json").write_text("{}")
    kept = fsv.keep_earlier(tmp_path, "rtx5090-dflash", settings, [])
    assert kept == tmp_path / "attempts" / "rtx5090-dflash-1.json"
    assert sorted(p.name for p in (tmp_path / "attempts").iterdir()) == [
        "rtx5090-dflash-1.bench.json", "rtx5090-dflash-1.json", "rtx5090-dflash-1.server-excerpt.log"]
    assert not (tmp_path / "rtx5090-dflash.json").exists()
    # The report finds it, with the excerpt beside it.
    (row,) = fr.build(_shapes(), records=[], roof=None, bandwidth=None, six_layer=None, gpu=None,
                      attempts=fr.load_records(tmp_path / "attempts"))["profile_attempts"]
    assert row["settings"]["max_num_seqs"] == 22 and row["settings"]["max_num_batched_tokens"] == 8192
    # A second correction gets the next number; a rerun with the same settings is only replaced.
    (tmp_path / "rtx5090-dflash.json").write_text(json.dumps({**old, "profile_settings": {"max_num_seqs": 8}}))
    assert fsv.keep_earlier(tmp_path, "rtx5090-dflash", settings, []).name == "rtx5090-dflash-2.json"
    (tmp_path / "rtx5090-dflash.json").write_text(json.dumps({**old, "profile_settings": settings}))
    assert fsv.keep_earlier(tmp_path, "rtx5090-dflash", settings, []) is None
    assert (tmp_path / "rtx5090-dflash.json").exists()


def test_the_series_line_counts_runs_on_a_current_series():
    from launcher.patching.series import series_for

    doc = {"profile_runs": {"a": {"series": series_for("0.21.0").hash}, "b": {"series": "f" * 64}},
           "profile_attempts": [{"series": None}]}
    line = fr._series_line(doc)
    assert "not recorded in 1 of 3" in line and "**1 of 3 on a current series**" in line


STAND_IN = """import json, os, sys
argv = sys.argv[1:]
label, out = argv[argv.index("--label") + 1], argv[argv.index("--out") + 1]
with open(os.path.join(out, "placed.txt"), "a") as f:
    f.write(f"{label} gpu={os.environ.get('CUDA_VISIBLE_DEVICES')} port={argv[argv.index('--port') + 1]} "
            f"steps={os.path.basename(os.environ['STEP_TIMES_OUT'])}\\n")
json.dump({"started": True}, open(os.path.join(out, label + ".json"), "w"))
open(os.environ["STEP_TIMES_OUT"], "w").write("")
"""


def test_the_frozen_servers_run_a_wave_per_gpu_set_and_a_rerun_starts_only_the_missing(tmp_path, monkeypatch):
    # A stand-in for fullsize_serve.py (a full-size server cannot run here): it notes the GPU,
    # port and step file each server was given, and leaves the record a measured server leaves.
    import speedup_frozen as sf

    (tmp_path / "serve.py").write_text(STAND_IN.replace("STEP_TIMES_OUT", sf.STEP_TIMES_ENV))
    monkeypatch.setattr(sf, "FULLSIZE_SERVE", tmp_path / "serve.py")
    args = type("A", (), {"recipe": "r", "launcher": "x", "model": tmp_path, "drafter": tmp_path, "out": tmp_path,
                          "series_hash": None, "vllm_arg": [], "set": [], "deadline_s": 10 * sf.SERVER_S})()
    labels = [sf.sm.server_label(k) for k in (None, *sf.sm.KS)]
    assert sf.run_waves(args, [None, *sf.sm.KS], ["0", "1"], sf.time.monotonic()) == 0
    placed = (tmp_path / "placed.txt").read_text().splitlines()
    # two waves of two: the second starts after the first has finished
    assert sorted(p.split()[0] for p in placed[:2]) == sorted(labels[:2])
    assert sorted(p.split()[0] for p in placed[2:]) == sorted(labels[2:])
    assert sorted(p.split()[1:3] for p in placed) == sorted([["gpu=0", "port=8011"], ["gpu=1", "port=8012"]] * 2)
    assert all(f"{p.split()[0]}-steps.jsonl" in p for p in placed)
    assert all(sf.measured(tmp_path, k) for k in (None, *sf.sm.KS))
    # One server's steps lost: only it runs again
    sf.steps_file(tmp_path, 7).unlink()
    (tmp_path / "placed.txt").unlink()
    pending = [k for k in (None, *sf.sm.KS) if not sf.measured(tmp_path, k)]
    assert pending == [7] and sf.run_waves(args, pending, ["0", "1"], sf.time.monotonic()) == 0
    assert [p.split()[:2] for p in (tmp_path / "placed.txt").read_text().splitlines()] == [[labels[2], "gpu=0"]]
    # Under a server's time left: nothing starts, 3 says run again
    args.deadline_s = sf.SERVER_S - 1
    assert sf.run_waves(args, [3], ["0"], sf.time.monotonic()) == 3


def test_a_server_that_did_not_measure_is_started_once_more(tmp_path, monkeypatch):
    # The stand-in leaves no record for K 7 the first time it is started (a server cut at its
    # start limit), and does the second time; a server that never measures is not started a third.
    import speedup_frozen as sf

    flaky = STAND_IN.replace("json.dump(", "first = not os.path.exists(os.path.join(out, label + '.tried'))\n"
                             "open(os.path.join(out, label + '.tried'), 'w').close()\n"
                             "if label == 'frozen-k7' and first: sys.exit(1)\n"
                             "if label == 'frozen-k15': sys.exit(1)\njson.dump(", 1)
    (tmp_path / "serve.py").write_text(flaky.replace("STEP_TIMES_OUT", sf.STEP_TIMES_ENV))
    monkeypatch.setattr(sf, "FULLSIZE_SERVE", tmp_path / "serve.py")
    args = type("A", (), {"recipe": "r", "launcher": "x", "model": tmp_path, "drafter": tmp_path, "out": tmp_path,
                          "series_hash": None, "vllm_arg": [], "set": [], "deadline_s": 10 * sf.SERVER_S})()
    assert sf.run_pending(args, ["0", "1"], sf.time.monotonic()) == 0
    started = [p.split()[0] for p in (tmp_path / "placed.txt").read_text().splitlines()]
    assert sorted(started) == sorted([sf.sm.server_label(k) for k in (None, 3, 7, 7, 15, 15)])
    assert [sf.measured(tmp_path, k) for k in (None, 3, 7, 15)] == [True, True, True, False]


def test_the_record_states_the_profile_the_release_serves():
    # On 0.33.0 the rtx5090 profile serves a shorter context (serve_since): the record of a
    # full-size server there must say so, not the profile's own 49,152 (its first 0.33.0
    # records did). The values come from the recipe file, read here with yaml, not the launcher.
    import yaml

    data = yaml.safe_load((GPU_DIR.parents[1] / "recipes" / "gemma4-moe-dflash.yaml").read_text())
    profile = data["profiles"]["rtx5090"]
    later = fsv.profile_settings("gemma4-moe-dflash", "rtx5090", "0.33.0")
    assert later["max_model_len"] == profile["serve_since"]["0.33.0"]["max_model_len"] != profile["serve"]["max_model_len"]
    assert later["serve_since"] == "0.33.0"
    earlier = fsv.profile_settings("gemma4-moe-dflash", "rtx5090", "0.21.0")
    assert earlier["max_model_len"] == profile["serve"]["max_model_len"] and "serve_since" not in earlier
    assert fsv.profile_settings("gemma4-moe-dflash", "rtx5090") == earlier
