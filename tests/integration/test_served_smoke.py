"""tests/gpu/runs/served.py end to end on this machine, with stand-ins for what needs a GPU.

vLLM cannot serve here, so a stand-in ``vllm`` package in a plain folder (the way
the device puts a vLLM site on ``PYTHONPATH``) answers as ``vllm serve``: its
entry point runs tests/integration/stub_openai.StubServer on the port the launcher
gives it (chat with logprobs and token ids, streaming, ``/tokenize``, ``/metrics``,
the completions ``launcher bench`` sends). A second stand-in plays stock vLLM 0.21.0
and dies at start-up with the seed error. Real: `launcher serve --test-gpu --wait`
run as served.py runs it (its own process group, the vLLM site on PYTHONPATH, stopped
with SIGTERM), the `openai` client (pip-installed into the cache once, at the bundle's
pins), `launcher bench`, the record. Not real: the preflight (no GPU, no weights
here), so every server is started with --force.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "gpu"))
import gpu_paths  # noqa: E402,F401  (the harness's group folders)

import served  # noqa: E402

from tests.unit.test_gpu_served import make_model_dir  # noqa: E402

MAIN = textwrap.dedent("""\
    import os, signal, sys, threading
    argv = sys.argv[1:]
    port = int(argv[argv.index("--port") + 1])
    print("WARNING Forcing --disable_chunked_mm_input for models with multimodal-bidirectional attention.", flush=True)
    if STOCK:
        print("ValueError: Selected backend AttentionBackendEnum.FLASH_ATTN is not valid for this configuration. "
              "Reason: ['partial multimodal token full attention not supported']", flush=True)
        print("RuntimeError: Engine core initialization failed. See root cause above.", flush=True)
        sys.exit(1)
    from tests.integration.stub_openai import Behaviour, StubServer
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with StubServer(Behaviour(model="gemma4", drafter="--speculative-config" in argv, ttft_s=0.0, chunk_s=0.0005),
                    port=port):
        stop.wait()
""")


def fake_site(root: Path, stock: bool, version: str = "0.21.0") -> Path:
    pkg = root / "vllm"
    (pkg / "entrypoints" / "cli").mkdir(parents=True)
    (pkg / "__init__.py").write_text(f'__version__ = "{version}"\n')
    (pkg / "entrypoints" / "__init__.py").write_text("")
    (pkg / "entrypoints" / "cli" / "__init__.py").write_text("")
    (pkg / "entrypoints" / "cli" / "main.py").write_text(f"STOCK = {stock}\n" + MAIN)
    info = root / f"vllm-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    return root


@pytest.fixture(scope="module")
def openai_client():
    """The bundle's openai pins (tests/gpu/bundle-requirements.txt), installed into the cache once."""
    from tests.unit.test_gpu_lm_files import _pip_target

    target = _pip_target("openai-client", ["openai==2.54.0", "distro==1.9.0", "jiter==0.19.0", "sniffio==1.3.1"])
    sys.path.insert(0, str(target))
    import openai

    return openai


@pytest.fixture
def forced_servers(tmp_path, monkeypatch) -> tuple[Path, int]:
    """Every server started with --force (no GPU and no weights here: the preflight blocks every
    start, the device's does not); returns the trained model stand-in and a --port-base with
    every phase's port free."""
    class Forced(served.Launched):
        def __init__(self, args, site, cwd, log, timeout, force=False, step_times=None):
            super().__init__(args, site, cwd, log, timeout, True, step_times)

    monkeypatch.setattr(served, "Launched", Forced)
    monkeypatch.setenv("MODELS_DIR", str(tmp_path / "models"))
    return make_model_dir(tmp_path / "trained"), _free_base()


@pytest.mark.network
def test_served_phases_end_to_end_against_stand_ins(openai_client, forced_servers, tmp_path):
    model, base = forced_servers
    patched, stock = fake_site(tmp_path / "site-patched", False), fake_site(tmp_path / "site-stock", True)
    out, work = tmp_path / "out", tmp_path / "work"
    code = served.main(["--model", str(model), "--drafter", str(tmp_path / "drafter"), "--site-patched", str(patched),
                        "--site-stock", str(stock), "--series-hash", "f" * 64, "--work", str(work), "--out", str(out),
                        "--gpu", "stand-in", "--deadline-s", "500", "--port-base", str(base)])
    assert code == 0
    doc = json.loads((out / "served.json").read_text())
    ref, dfl, stk = doc["servers"]
    assert [r["server"] for r in doc["servers"]] == ["reference", "dflash", "stock"]

    # Started by the launcher, with the vLLM site on PYTHONPATH, on 127.0.0.1.
    for row in (ref, dfl):
        assert row["started"] and row["ready_s"] is not None
        assert row["started_by"].startswith("launcher serve --recipe gemma4-moe-dflash --model ")
        assert "--test-gpu" in row["started_by"] and "--wait" in row["started_by"]
        assert row["argv"][1:5] == ["-m", "vllm.entrypoints.cli.main", "serve", str(model)]
        assert row["argv"][row["argv"].index("--host") + 1] == "127.0.0.1"
        assert row["vllm"] == "0.21.0" and row["series"] == "f" * 64
        assert row["recipe"] == "gemma4-moe-dflash" and row["profile"] == "rtx5090"
    assert "--speculative-config" in dfl["argv"] and "--speculative-config" not in ref["argv"]
    assert "--no-enable-prefix-caching" in ref["argv"]

    # The requests, their verdicts, the evidence.
    assert ref["reproducible"]["reproducible"] and ref["images_change_output"] is True
    assert dfl["requests"] == {"text": 8, "image": 6, "multi_image": 3, "image_at_chunk_boundary": 1,
                               "multi_turn_image": 1, "tool": 1, "stream": 2}
    assert dfl["concurrency"] == [1, 8, 22] and dfl["lossless"] is True and not dfl["errors"]
    assert all(v["identical"] == 22 for v in dfl["verdict"].values())
    assert dfl["acceptance_length"] == pytest.approx(1.0) and dfl["acceptance_above_bar"] is False
    assert dfl["tool"]["accepted"] and dfl["tool"]["answered"]
    assert dfl["prefix_cache"]["cached_tokens"] > 0
    assert dfl["chunk_boundary"]["disable_chunked_mm_input_forced"] is True
    assert "server_image_start" in dfl["chunk_boundary"]
    # launcher bench against the same server, its JSON beside the record.
    assert dfl["bench"] == "tests/gpu/results/served-bench-0.21.0.json"
    bench = json.loads((out / "served-bench-0.21.0.json").read_text())
    # The recipe's bench runs each workload at 1 and at the profile's max_num_seqs.
    import fullsize_serve

    top = fullsize_serve.profile_settings("gemma4-moe-dflash", "rtx5090")["max_num_seqs"]
    assert {(r["workload"], r["concurrency"]) for r in bench["runs"]} == {("random", 1), ("random", top),
                                                                           ("prompts", 1), ("prompts", top)}
    assert bench["random_token_band"][1] == 8192

    # Stock: refused without --force, then the start-up error.
    assert stk["refused_without_force"] and stk["preflight_blocking"]
    assert stk["stock_error"].startswith("start-up: ValueError: Selected backend")
    assert "partial multimodal token full attention not supported" in stk["stock_error"]
    assert (out / "served.md").read_text().count("\n## ") == 3

    # Every server was stopped: nothing listens on the ports any more.
    assert _phase_ports_free(base, ("reference", "dflash", "stock"))


@pytest.mark.network
def test_the_text_only_recipe_on_0_33_0_end_to_end_against_stand_ins(openai_client, forced_servers, tmp_path):
    """remote.sh served-all's 0.33.0 job with SERVED_RECIPE=gemma4-moe-dflash-text, its phases side
    by side (SERVED_PARALLEL=1): the launcher plans the text-only recipe for a 0.33.0 site, only requests
    without images are sent, and its rows join an existing record beside the multimodal recipe's."""
    model, base = forced_servers
    patched = fake_site(tmp_path / "site-patched", False, "0.33.0")
    out, work = tmp_path / "out", tmp_path / "work"
    out.mkdir()
    (out / "served.json").write_text(json.dumps({"servers": [
        {"server": "dflash", "vllm": "0.33.0", "recipe": "gemma4-moe-dflash", "lossless": True}]}))
    code = served.main(["--model", str(model), "--drafter", str(tmp_path / "drafter"), "--site-patched", str(patched),
                        "--series-hash", "e" * 64, "--work", str(work), "--out", str(out), "--gpu", "stand-in",
                        "--deadline-s", "400", "--phases", "reference,dflash", "--recipe", "gemma4-moe-dflash-text",
                        "--raw-name", "served-v33-text-raw", "--parallel", "--stagger-s", "1",
                        "--port-base", str(base)])
    assert code == 0
    doc = json.loads((out / "served.json").read_text())
    assert [(r["server"], r["vllm"], r["recipe"]) for r in doc["servers"]] == [
        ("dflash", "0.33.0", "gemma4-moe-dflash"),
        ("reference", "0.33.0", "gemma4-moe-dflash-text"), ("dflash", "0.33.0", "gemma4-moe-dflash-text")]
    ref, dfl = doc["servers"][1:]
    assert "--language-model-only" in dfl["argv"] and "--language-model-only" in ref["argv"]
    assert dfl["started_by"].startswith("launcher serve --recipe gemma4-moe-dflash-text ")
    assert dfl["requests"] == {"text": 8, "image": 0, "multi_image": 0, "image_at_chunk_boundary": 0,
                               "multi_turn_image": 0, "tool": 1, "stream": 1}
    assert dfl["lossless"] is True and not dfl["errors"] and ref["images_change_output"] is None
    assert "chunk_boundary" not in dfl
    assert sorted(p.name for p in (out / "served-v33-text-raw").iterdir()) == [
        "dflash.json", "dflash.log", "reference.json", "reference.log"]
    # Its benchmark beside the multimodal recipe's, not over it.
    assert dfl["bench"] == "tests/gpu/results/served-bench-0.33.0-text.json"
    assert (out / "served-bench-0.33.0-text.json").exists()
    # Side by side: each server started before the other stopped.
    raw = {n: json.loads((work / f"{n}.json").read_text()) for n in ("reference", "dflash")}
    assert raw["reference"]["started_at"] < raw["dflash"]["stopped_at"]
    assert raw["dflash"]["started_at"] < raw["reference"]["stopped_at"]
    assert _phase_ports_free(base, ("reference", "dflash"))


def _free_base() -> int:
    """A port with the two after it free too (the phases' PORT_OFFSETS)."""
    for _ in range(50):
        base = _free_port()
        if all(_port_free(base + i) for i in range(1, max(served.PORT_OFFSETS.values()) + 1)):
            return base
    raise RuntimeError("no three consecutive free ports")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _phase_ports_free(base: int, phases: tuple[str, ...]) -> bool:
    """The ports of the phases a test ran are free again (their servers stopped). Only those: a
    port no phase of the test used may meanwhile be any other process's (an outgoing
    connection's ephemeral port, from a test running beside this one)."""
    return all(_port_free(base + served.PORT_OFFSETS[p]) for p in phases)


def _port_free(port: int) -> bool:
    import socket

    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


@pytest.mark.network
def test_the_speed_phase_benches_the_recipe_without_and_with_its_drafter(openai_client, forced_servers, tmp_path):
    """Issue 25, item 5 through the served path: both servers started by `launcher serve`, the
    no-drafter one changed in nothing but the drafter, `launcher bench --concurrency 1,4,16`
    against each, and the comparison in a row of its own."""
    model, base = forced_servers
    patched = fake_site(tmp_path / "site-patched", False)
    out, work = tmp_path / "out", tmp_path / "work"
    code = served.main(["--model", str(model), "--drafter", str(tmp_path / "drafter"), "--site-patched", str(patched),
                        "--series-hash", "f" * 64, "--work", str(work), "--out", str(out), "--gpu", "stand-in",
                        "--deadline-s", "400", "--phases", "speed", "--port-base", str(base)])
    assert code == 0
    raw = {n: json.loads((work / f"{n}.json").read_text()) for n in ("speed-reference", "speed-dflash")}
    assert "--speculative-config" not in raw["speed-reference"]["argv"]
    assert "--speculative-config" in raw["speed-dflash"]["argv"]
    # The baseline is the recipe less its drafter: prefix caching stays as the recipe has it.
    assert "--no-enable-prefix-caching" not in raw["speed-reference"]["argv"]
    assert raw["speed-reference"]["started_at"] < raw["speed-dflash"]["stopped_at"]
    row = next(r for r in json.loads((out / "served.json").read_text())["servers"] if r["server"] == "speed")
    assert row["concurrency"] == [1, 4, 16] and row["numerics"] == "default"
    assert [s["concurrency"] for s in row["speed"]] == [1, 4, 16]
    assert all(s["output_tok_s"]["with_drafter"] and s["output_tok_s"]["without"] for s in row["speed"])
    # Every gated prompt (prompts.json) once a level at least, and at least the curve's 32
    # requests per level on both sides (the recipe alone sends 4 at 1 in flight)
    prompts = json.loads((model / "prompts.json").read_text())
    n = max(32, len(prompts))
    assert [s["requests"] for s in row["speed"]] == [{"with_drafter": k, "without": k} for k in (n, n, max(64, n))]
    baseline = json.loads((out / "served-bench-0.21.0-speed-no-drafter.json").read_text())
    assert baseline["speculative_decoding"] is False and {r["workload"] for r in baseline["runs"]} == {"prompts"}
    # ... sent as their token ids at the gate's 128 tokens, and what each server said judged by
    # the gate at concurrency 1 (the stand-in's outputs are a hash of the prompt: none loops)
    assert baseline["prompts_file"]["prompts"] == len(prompts) and {r["output_len"] for r in baseline["runs"]} == {128}
    nd = row["nondegenerate"]
    assert nd["dflash"]["sequences"] == nd["reference"]["sequences"] == n
    assert nd["dflash"]["prompts"] == len(prompts) and nd["dflash"]["min_generated_tokens"] == 128
    assert nd["dflash"]["looping_sequences"] == 0 and nd["dflash"]["looping_prompts"] == []
    assert row["bench"] == "tests/gpu/results/served-bench-0.21.0-speed-dflash.json"
    # The stand-ins are not vLLM: the step-time plugin never loads in them, so no step was
    # timed and no projection is claimed (tests/unit/test_gpu_step_times.py covers both).
    assert raw["speed-dflash"]["step_counts"] == {"speed-dflash": 0, "speed-reference": 0}
    assert "speed_projection" not in raw["speed-dflash"] and "projected_speedup" not in row["speed"][0]
    assert sorted(p.name for p in (out / "served-raw").iterdir()) == [
        "speed-dflash.json", "speed-dflash.log", "speed-reference.json", "speed-reference.log"]
    assert _phase_ports_free(base, ("speed-reference", "speed-dflash"))


def test_the_speed_phase_refuses_exact_numerics(tmp_path, capsys):
    import os

    with pytest.raises(SystemExit):
        served.main(["--model", str(tmp_path), "--drafter", str(tmp_path), "--site-patched", "/x", "--work",
                     str(tmp_path / "w"), "--out", str(tmp_path / "o"), "--phases", "speed", "--exact-numerics"])
    assert "not with --exact-numerics" in capsys.readouterr().err
    assert "VLLM_BATCH_INVARIANT" not in os.environ  # refused before anything was set
