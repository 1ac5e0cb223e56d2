"""The pure parts of tests/gpu/runs/served.py (issue 26): images, requests, the chunk-boundary
arithmetic, output parsing, verdicts, acceptance from /metrics, the record.

The image and template arithmetic is also checked against transformers' own Gemma 4
processor (the one vLLM 0.21.0 builds) in a subprocess with Pillow and torchvision, as
tests/unit/test_gpu_lm_files.py does.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import pytest

GPU_DIR = Path(__file__).resolve().parents[1] / "gpu"
sys.path.insert(0, str(GPU_DIR))

import lm_files as lm  # noqa: E402
import served  # noqa: E402
import served_report as report  # noqa: E402
import served_requests as sr  # noqa: E402
import train_target as tt  # noqa: E402

VISION_CFG = tt.target_config()["vision_config"]
STDLIB_FILES = ["argparse.py", "dataclasses.py", "difflib.py", "enum.py", "functools.py", "json/decoder.py",
                "json/encoder.py", "pprint.py", "random.py", "shlex.py", "statistics.py", "string.py",
                "textwrap.py", "tokenize.py", "typing.py", "uuid.py", "warnings.py", "weakref.py", "calendar.py",
                "csv.py", "fractions.py", "heapq.py", "inspect.py", "locale.py", "pathlib.py", "pickle.py",
                "queue.py", "sched.py", "selectors.py", "socket.py", "subprocess.py", "tarfile.py", "threading.py",
                "traceback.py", "zipfile/__init__.py", "ast.py"]


def decode_png(data: bytes) -> tuple[int, int, list[bytes]]:
    """Width, height and RGB rows of an 8-bit RGB PNG with filter 0, checking every CRC."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, {}
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        assert struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])[0] == zlib.crc32(kind + body)
        chunks[kind] = body
        pos += 12 + n
    w, h, depth, color, _, _, _ = struct.unpack(">IIBBBBB", chunks[b"IHDR"])
    assert (depth, color) == (8, 2) and b"IEND" in chunks
    raw = zlib.decompress(chunks[b"IDAT"])
    stride = 1 + 3 * w
    rows = [raw[i * stride:(i + 1) * stride] for i in range(h)]
    assert all(r[0] == 0 for r in rows)
    return w, h, [r[1:] for r in rows]


# ----------------------------------------------------------------- fixtures


def make_model_dir(out: Path) -> Path:
    """A folder with what served.py reads of the trained target: config, tokenizer, chat
    template, processor files and prompts.json (held-out stdlib texts), no weights."""
    real = Path(lm._stdlib_dir())
    texts = [(real / f).read_text(encoding="utf-8") for f in STDLIB_FILES if (real / f).is_file()]
    assert len(texts) >= 30
    out.mkdir(parents=True, exist_ok=True)
    tok = lm.train_tokenizer(texts[:20], vocab_size=1024)
    lm.write_lm_files(tok, out, VISION_CFG)
    (out / "config.json").write_text(json.dumps(tt.target_config()))
    prompts = [{"text": t[:3000 if i < 18 else 20000], "token_ids": [2], "max_tokens": 128} for i, t in enumerate(texts)]
    prompts[19]["shared_prefix"] = 640  # left out of the filler
    (out / "prompts.json").write_text(json.dumps(prompts))
    return out


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("trained"))


@pytest.fixture(scope="module")
def made(model_dir):
    return served.inputs(model_dir, 2560)


# ------------------------------------------------------------------ images


def test_pngs_are_deterministic_valid_and_unlike_each_other():
    seen = {}
    for name, image in sr.IMAGES.items():
        data = sr.png(image)
        assert data == sr.png(image)  # same bytes every time
        assert len(data) < 64_000
        w, h, rows = decode_png(data)
        assert (w, h) == (image.width, image.height)
        seen[name] = rows
    # visually different: most pixels differ between any two (compared on the common area)
    for a, b in (("A", "B"), ("A", "C"), ("B", "C")):
        h = min(len(seen[a]), len(seen[b]))
        w = min(len(seen[a][0]), len(seen[b][0])) // 3
        differ = sum(seen[a][y][3 * x:3 * x + 3] != seen[b][y][3 * x:3 * x + 3] for y in range(h) for x in range(w))
        assert differ > 0.5 * w * h, (a, b, differ)
    url = sr.data_url("B")
    assert url.startswith("data:image/png;base64,")
    import base64
    assert base64.b64decode(url.split(",", 1)[1]) == sr.png(sr.IMAGES["B"])


def test_soft_tokens_follow_vllms_formula():
    v = sr.Vision.from_config(tt.target_config())
    assert (v.patch_size, v.pooling_kernel_size, v.max_soft_tokens) == (16, 3, 70)
    assert (v.boi_id, v.image_id, v.eoi_id) == (lm.SPECIAL_TOKENS["<|image>"], lm.SPECIAL_TOKENS["<|image|>"],
                                                lm.SPECIAL_TOKENS["<image|>"])
    # 256x256: 630 patches allowed, 16x16 -> scaled to 384x384 (24x24 patches) -> 576 / 9 = 64
    assert sr.soft_tokens(sr.IMAGES["A"], v) == 64
    assert sr.soft_tokens(sr.IMAGES["B"], v) == sr.soft_tokens(sr.IMAGES["C"], v) == 63
    assert sr.image_span(sr.IMAGES["A"], v) == 66
    huge = sr.Image("x", 3, 900, "gradient")
    assert sr.soft_tokens(huge, v) <= 70  # clamped, as vLLM clamps


# ------------------------------------------------------------------ requests


def test_the_22_requests_cover_every_kind(made):
    reqs, _, _ = made
    assert len(reqs) == 22 == max(sr.CONCURRENCY)
    assert len({r.id for r in reqs}) == 22
    assert sr.counts(reqs) == {"text": 8, "image": 6, "multi_image": 3, "image_at_chunk_boundary": 1,
                               "multi_turn_image": 1, "tool": 1, "stream": 2}
    by = {r.id: r for r in reqs}
    # 1-3 images, at the start, the end, the middle
    assert {len(r.images) for r in reqs if r.images} == {1, 2, 3}
    first_part = lambda r: r.messages[0]["content"][0]["type"]  # noqa: E731
    assert first_part(by["image-first"]) == "image" and by["image-last"].messages[0]["content"][-1]["type"] == "image"
    assert [p["type"] for p in by["image-middle"].messages[0]["content"]] == ["text", "image", "text"]
    assert by["multi-bac"].images == ["B", "A", "C"]
    # the probes: one prompt, three images
    probes = [r for r in reqs if r.probe == "images"]
    assert [r.images for r in probes] == [["A"], ["B"], ["C"]]
    strip = lambda r: [p for p in r.messages[0]["content"] if p["type"] == "text"]  # noqa: E731
    assert strip(probes[0]) == strip(probes[1]) == strip(probes[2])
    # the multi-turn request repeats image-first's turn and comes after it
    ids = [r.id for r in reqs]
    assert ids.index("multi-turn") > ids.index("image-first")
    assert by["multi-turn"].messages[0] == by["image-first"].messages[0]
    assert [m["role"] for m in by["multi-turn"].messages] == ["user", "assistant", "user"]
    assert by["tool"].tools and by["tool"].tools[0]["function"]["name"] == "run_python"
    assert [r.id for r in reqs if r.stream] == ["stream-text", "stream-image"]
    # requests.json round trip
    assert [r.to_dict() for r in sr.loads(sr.dumps(reqs))] == [r.to_dict() for r in reqs]


def test_openai_messages_carry_the_pngs_in_place(made):
    reqs, _, _ = made
    req = next(r for r in reqs if r.id == "multi-bac")
    parts = sr.openai_messages(req)[0]["content"]
    assert [p["type"] for p in parts] == ["image_url", "text", "image_url", "text", "image_url"]
    assert parts[0]["image_url"]["url"] == sr.data_url("B")
    tool = sr.openai_messages(next(r for r in reqs if r.kind == "tool"))
    assert isinstance(tool[0]["content"], str)
    assert json.dumps(sr.openai_messages(req))  # JSON as the client sends it


# ------------------------------------------------------------- chunk boundary


def test_the_chunk_boundary_image_straddles_the_first_chunk(made, model_dir):
    reqs, vision, tokenize = made
    req = next(r for r in reqs if r.kind == "image_at_chunk_boundary")
    n = req.notes
    assert n["chunk"] == 2560 and n["straddles"]
    assert n["image_start"] < 2560 < n["image_end"] == n["image_start"] + n["span"]
    assert abs(n["image_start"] - (2560 - n["span"] // 2)) <= 3  # half a span before the boundary
    ids = tokenize(req.messages)
    assert ids.count(vision.image_id) == 1 and ids.index(vision.image_id) == n["image_start"]
    assert n["prompt_tokens_expanded"] == len(ids) - 1 + n["span"]
    assert n["prompt_tokens_expanded"] + sr.MAX_TOKENS <= 4096  # fits the served max_model_len
    # the filler shares no prefix with another request (a cache hit would move the first chunk)
    text = req.messages[0]["content"][0]["text"]
    others = [p.get("text") or "" for r in reqs if r is not req for m in r.messages
              for p in (m["content"] if isinstance(m["content"], list) else [{"text": m["content"]}])]
    assert not any(o[:200] == text[:200] for o in others)


def test_expanded_spans_shift_later_images():
    v = sr.Vision()
    ids = [2, 5, 9, 30, 31, 9, 32]
    a, b = sr.IMAGES["A"], sr.IMAGES["B"]
    (s1, e1), (s2, e2) = sr.expanded_spans(ids, [a, b], v)
    assert (s1, e1) == (2, 2 + 66)
    assert s2 == 5 + 65 and e2 == s2 + 65
    with pytest.raises(ValueError):
        sr.expanded_spans(ids, [a], v)
    assert sr.straddles(10, 20, 15) and not sr.straddles(10, 20, 10) and not sr.straddles(10, 20, 20)


def test_a_filler_too_short_is_refused(model_dir):
    tokenize = sr.local_tokenizer(model_dir)
    with pytest.raises(ValueError, match="filler too short"):
        sr.chunk_boundary_request("def f():\n    return 1\n", tokenize, sr.Vision(), 2560)


def test_local_render_is_the_trained_template(model_dir):
    template = (model_dir / "chat_template.jinja").read_text()
    req = sr.Req("x", "image", [{"role": "user", "content": [{"type": "text", "text": " Look: "},
                                                            {"type": "image", "image": "A"},
                                                            {"type": "text", "text": "Why?"}]},
                                {"role": "assistant", "content": "Because."}])
    assert sr.render(template, req.messages) == \
        "<bos><|turn>user\nLook:\n\n<|image|>\n\nWhy?<turn|>\n<|turn>model\nBecause.<turn|>\n<|turn>model\n"


# ------------------------------------------------------------------ outputs


def _content(ids, tops):
    return [{"token": f"token_id:{t}", "logprob": 0.0,
             "top_logprobs": [{"token": f"token_id:{a}", "logprob": b} for a, b in top]} for t, top in zip(ids, tops)]


def test_output_record_reads_token_ids_and_ranks_by_value():
    content = _content([5, 7], [[(5, 10.0), (3, 9.5)], [(7, 4.0), (2, 4.5), (7, 4.0), (9, 1.0)]])
    rec = report.output_record(content)
    assert rec["token_ids"] == [5, 7]
    assert rec["top"][0] == [[5, 10.0, 1], [3, 9.5, 2]]
    assert rec["top"][1] == [[2, 4.5, 1], [7, 4.0, 2], [9, 1.0, 3]]  # the sampled token listed first, ranked by value
    nan = report.output_record(_content([1], [[(1, None), (2, 0.5)]]))
    assert nan["top"][0][-1][0] == 1 and str(nan["top"][0][-1][1]) == "nan"
    with pytest.raises(ValueError, match="return_tokens_as_token_ids"):
        report.output_record([{"token": "hello", "top_logprobs": []}])


def _out(id_, kind, ids, gaps=None):
    top = [[[t, 10.0, 1], [t + 1, 10.0 - (gaps or {}).get(i, 2.0), 2]] for i, t in enumerate(ids)]
    return {"id": id_, "kind": kind, "token_ids": list(ids), "top": top}


def test_judge_is_compares_tie_rule_per_request():
    ref = [_out("a", "text", [1, 2, 3]), _out("b", "image", [4, 5, 6], gaps={1: 0.0}), _out("c", "tool", [7, 8])]
    same = judge = report.judge(ref, [dict(o) for o in ref])
    assert same["lossless"] and same["identical"] == 3
    tie = report.judge(ref, [ref[0], _out("b", "image", [4, 6, 9]), ref[2]])  # 6 is b's runner-up at a 0 gap
    assert tie["lossless"] and tie["divergences"][0]["tie"] and tie["divergences"][0]["id"] == "b"
    off = report.judge(ref, [_out("a", "text", [1, 3, 3]), ref[1], {"id": "c", "kind": "tool", "error": "boom"}])
    assert not off["lossless"] and off["errors"] == [{"id": "c", "error": "boom"}]
    kinds = {"a": "text", "b": "image", "c": "tool"}
    assert report.lossless_by_kind({"1": judge, "8": off}, kinds) == {"image": True, "text": False, "tool": False}
    agree = report.passes_agree(ref, [dict(o) for o in ref])
    assert agree == {"reproducible": True, "differing": [], "failed": []}
    assert report.passes_agree(ref, [ref[0], _out("b", "image", [4, 5, 7]), ref[2]])["differing"] == ["b"]


def test_images_change_output_needs_every_probe_pair_to_differ(made):
    reqs, _, _ = made
    outs = [_out("probe-A", "image", [1, 2]), _out("probe-B", "image", [1, 3]), _out("probe-C", "image", [2, 2])]
    assert report.images_change_output(outs, reqs)["value"] is True
    outs[2] = _out("probe-C", "image", [1, 2])
    got = report.images_change_output(outs, reqs)
    assert got["value"] is False and got["pairs"]["probe-A vs probe-C"] is False
    assert report.images_change_output(outs[:2], reqs)["value"] is None


METRICS = """# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{{engine="0",model_name="gemma4"}} {drafts}
vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="gemma4"}} {draft_tokens}
vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="gemma4"}} {accepted}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="gemma4",position="0"}} {pos0}
"""


def test_acceptance_length_comes_from_two_metrics_scrapes():
    before = METRICS.format(drafts=10, draft_tokens=150, accepted=5, pos0=5)
    after = METRICS.format(drafts=110, draft_tokens=1650, accepted=85, pos0=65)
    acc = report.acceptance(before, after)
    assert acc["drafts"] == 100 and acc["accepted_tokens"] == 80
    assert acc["mean_acceptance_length"] == pytest.approx(1.8)
    assert acc["per_position_acceptance"] == [pytest.approx(0.6)]
    assert report.acceptance(None, after) is None
    assert report.acceptance("# nothing\n", "# nothing\n") is None  # no drafter: no counters


LOG = """INFO 11-26 19:26:47 [config.py:159] Gemma4 model has heterogeneous head dimensions (head_dim=256, global_head_dim=512). Forcing TRITON_ATTN backend to prevent mixed-backend numerical divergence.
WARNING 11-26 19:26:47 [cuda.py:237] Forcing --disable_chunked_mm_input for models with multimodal-bidirectional attention.
INFO 11-26 19:26:49 [cuda.py:312] Using AttentionBackendEnum.TRITON_ATTN backend.
INFO 11-26 19:26:50 [cuda.py:312] Using AttentionBackendEnum.FLASH_ATTN backend.
INFO 11-26 19:26:50 [flash_attn.py:661] Using FlashAttention version 2
INFO 11-26 19:28:40 [hf.py:478] Detected the chat template content format to be 'string'. You can set `--chat-template-content-format` to override this.
(EngineCore pid=1) ValueError: Selected backend AttentionBackendEnum.FLASH_ATTN is not valid for this configuration. Reason: ['partial multimodal token full attention not supported']
RuntimeError: Engine core initialization failed. See root cause above.
"""


def test_log_facts():
    facts = report.log_facts(LOG)
    assert facts["forced_whole_mm_input"] and facts["forced_triton"]
    assert facts["backends"] == ["FLASH_ATTN", "TRITON_ATTN"] and facts["flash_attn_versions"] == ["2"]
    assert facts["chat_template_content_format"] == ["string"]
    assert facts["error_line"] == ("ValueError: Selected backend AttentionBackendEnum.FLASH_ATTN is not valid for "
                                   "this configuration. Reason: ['partial multimodal token full attention not supported']")


def test_the_root_cause_is_found_behind_vllm_0_21_0s_process_and_log_prefixes():
    """vLLM 0.21.0's API server prints the engine core's traceback only as its own logged lines,
    each behind "(EngineCore pid=N) ERROR date [file:line] " (the stock start of 2026-11-27)."""
    text = ("(EngineCore pid=3150) ERROR 11-27 12:35:21 [core.py:1140]     raise ValueError(\n"
            "(EngineCore pid=3150) ERROR 11-27 12:35:21 [core.py:1140] ValueError: Selected backend "
            "AttentionBackendEnum.FLASH_ATTN is not valid for this configuration. Reason: "
            "['partial multimodal token full attention not supported']\n"
            "(APIServer pid=2065) RuntimeError: Engine core initialization failed. See root cause above. "
            "Failed core proc(s): {}\n")
    assert report.log_facts(text)["error_line"].startswith("ValueError: Selected backend")
    phase = {"server": "stock", "started": False, "stock_outcome": "did not start", "exit_code": 1,
             "log_facts": report.log_facts(text)}
    assert "partial multimodal token" in report.stock_error(phase)
    assert report.stock_error({**phase, "log_facts": {}}) == "start-up: launcher exit 1 before ready"


def test_the_launchers_own_refusal_is_kept():
    text = "recipe x\nerror: preflight blocks the start: no vLLM found\nhint: pass --vllm-python\n"
    assert report.log_facts(text)["launcher_error"] == \
        "error: preflight blocks the start: no vLLM found hint: pass --vllm-python"
    assert report.log_facts(LOG)["launcher_error"] is None


def test_stock_start_up_error_is_the_root_cause():
    text = LOG.replace("(EngineCore pid=1) ", "")
    assert "partial multimodal token full attention not supported" in report.log_facts(text)["error_line"]


# ------------------------------------------------------------------ the record


def _phases(reqs, vision):
    ref_outs = [_out(r.id, r.kind, [i + 1, i + 2, i + 3 + (i % 3)]) for i, r in enumerate(reqs)]
    for o in ref_outs:
        if o["id"] == "chunk-boundary":
            o.update(prompt_tokens=2600, cached_tokens=0)
    plan = {"recipe": "gemma4-moe-dflash", "profile": "rtx5090", "vllm_version": "0.21.0",
            "test_gpu": {"stands_in_for": "rtx5090 (sm_120)", "gpu": "H100", "sets": ["a=b"]},
            "env": {"X": "1"}, "reasons": [], "argv": ["vllm", "serve", "m"]}
    common = {"plan": plan, "vllm": "0.21.0", "started": True, "ready_s": 99.0, "argv": ["python", "-m", "vllm"],
              "started_by": "launcher serve --recipe gemma4-moe-dflash", "requests": [r.to_dict() for r in reqs],
              "vision": vision.__dict__, "log_facts": {"forced_whole_mm_input": True}}
    chunk = next(r for r in reqs if r.kind == "image_at_chunk_boundary")
    server_ids = [0] * chunk.notes["image_start"] + [vision.boi_id] + [9] * (chunk.notes["span"] - 2) + [vision.eoi_id]
    reference = {**common, "server": "reference", "series": "abc123", "passes": [ref_outs, ref_outs],
                 "server_tokenize": server_ids}
    dflash = {**common, "server": "dflash", "series": "abc123",
              "levels": {str(c): [dict(o) for o in ref_outs] for c in sr.CONCURRENCY},
              "metrics_before": METRICS.format(drafts=0, draft_tokens=0, accepted=0, pos0=0),
              "metrics_after": METRICS.format(drafts=100, draft_tokens=1500, accepted=2, pos0=2),
              "bench": "tests/gpu/results/served-bench-0.21.0.json", "server_tokenize": server_ids}
    stock = {"server": "stock", "series": "stock", "vllm": "0.21.0", "started": False, "plan": {
        **plan, "reasons": [{"area": "patches", "message": "required patch x is not applied", "blocking": True}]},
        "stock_error": "start-up: ValueError: ... partial multimodal token full attention not supported",
        "stock_outcome": "did not start", "refused_without_force": True, "started_by": "launcher serve ... --force"}
    return {"reference": reference, "dflash": dflash, "stock": stock}


def test_rows_carry_the_issues_fields(made, tmp_path):
    reqs, vision, _ = made
    phases = _phases(reqs, vision)
    for name, phase in phases.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(phase))
    doc = served.assemble(tmp_path, tmp_path / "out", {"command": "bash tests/gpu/remote.sh served",
                                                        "target_sha256": "9ee9", "drafter_sha256": "d46bce41aa"})
    ref, dfl, stock = doc["servers"]
    for row in (ref, dfl, stock):
        for key in ("vllm", "series", "recipe", "profile", "started_by", "argv", "requests", "images_change_output",
                    "concurrency", "lossless", "nondegenerate", "acceptance_length", "bench", "stock_error"):
            assert key in row, (row["server"], key)
    assert ref["reproducible"]["reproducible"] and ref["images_change_output"] is True
    assert dfl["lossless"] is True and dfl["concurrency"] == [1, 8, 22]
    assert dfl["requests"] == sr.counts(reqs) and set(dfl["lossless_by_kind"]) == set(sr.KINDS)
    assert dfl["acceptance_length"] == pytest.approx(1.02) and dfl["acceptance_above_bar"] is False
    assert dfl["chunk_boundary"]["straddles"] and dfl["chunk_boundary"]["server_agrees"]
    assert dfl["chunk_boundary"]["span_kept_whole"]
    assert dfl["tool"]["accepted"] and dfl["bench"].endswith(".json")
    assert stock["stock_error"].startswith("start-up:") and stock["preflight_blocking"]
    assert stock["lossless"] is None and stock["refused_without_force"]
    md = (tmp_path / "out" / "served.md").read_text()
    assert "| dflash | 0.21.0 | gemma4-moe-dflash | abc123 | **stale** | d46bce41 | default | rtx5090 |" in md and "partial multimodal token" in md
    assert json.loads((tmp_path / "out" / "served.json").read_text()) == doc


def test_a_divergence_off_a_tie_makes_the_row_not_lossless(made, tmp_path):
    reqs, vision, _ = made
    phases = _phases(reqs, vision)
    outs = phases["dflash"]["levels"]["22"]
    outs[3] = dict(outs[3], token_ids=[99] + outs[3]["token_ids"][1:])
    (row,) = report.rows({"reference": phases["reference"], "dflash": phases["dflash"]})[1:]
    assert row["lossless"] is False and row["lossless_by_kind"][outs[3]["kind"]] is False
    assert row["verdict"]["22"]["divergences"][0]["id"] == outs[3]["id"]
    phases["reference"]["passes"][1] = [dict(o, token_ids=[0]) for o in phases["reference"]["passes"][1]]
    (row,) = report.rows({"reference": phases["reference"], "dflash": phases["dflash"]})[1:]
    assert row["lossless"] is None and row["lossless_reason"] == "reference not reproducible"


# ------------------------------------------------------------------ the servers


def test_serve_args_put_launcher_flags_before_the_vllm_arguments():
    args = served.serve_args("dflash", "/m", "/d", 8000)
    cut = args.index("--")
    assert args[:4] == ["serve", "--recipe", "gemma4-moe-dflash", "--model"] and "--test-gpu" in args[:cut]
    assert args[args.index("--host") + 1] == "127.0.0.1"
    assert args[cut + 1:] == served.EXTRA_ARGS
    full = served._with_flags(args, "--wait", "--timeout", "480")
    assert full.index("--wait") < full.index("--") and full[full.index("--") + 1:] == served.EXTRA_ARGS
    ref = served.serve_args("reference", "/m", "/d", 8001)
    assert "--drafter" not in ref and "drafter=null" in ref and ref[-1] == "--no-enable-prefix-caching"


def test_the_served_plan_is_ready_on_a_test_gpu(model_dir, monkeypatch, tmp_path):
    """The --set items and extra arguments served.py gives the launcher make a plan with no
    blocking reason on an H100 standing in (weights aside: the folder has none here)."""
    from launcher.checks import resolve
    from launcher.plan import Request
    from tests.unit.conftest import H100, make_ctx

    monkeypatch.setenv("MODELS_DIR", str(tmp_path))
    for phase in ("dflash", "reference"):
        args = served.serve_args(phase, str(model_dir), str(model_dir), 8000)
        cut = args.index("--")
        sets = [args[i + 1] for i, a in enumerate(args[:cut]) if a == "--set"]
        req = Request("gemma4-moe-dflash", model=str(model_dir), vllm_version="0.21.0", test_gpu=True, sets=sets,
                      extra_args=args[cut + 1:])
        plan = resolve(req, make_ctx(H100, vllm="0.21.0", transformers="5.13.1"))
        assert plan.test_gpu is not None
        assert (plan.drafter is None) == (phase == "reference")
        argv = plan.argv
        assert argv[argv.index("--max-num-batched-tokens") + 1] == "2560"
        assert argv[argv.index("--max-model-len") + 1] == "4096"
        assert "--moe-backend" not in argv  # bf16 MoE: vLLM's own choice
        assert plan.env["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
        blocking = [r.message for r in plan.reasons if r.blocking and r.area not in ("checkpoint", "drafter")]
        assert blocking == []
        assert ("--enable-prefix-caching" in argv) == (phase == "dflash")


def test_the_straddle_needs_a_chunk_of_the_largest_multimodal_item():
    """2,560 >= 32 video frames x (70 + 2 + 6) tokens: vLLM refuses a smaller chunk with chunked mm input off."""
    chunk = int(next(s for s in served.SETS if s.startswith("serve.max_num_batched_tokens=")).split("=")[1])
    assert chunk >= 32 * (70 + 2 + 6)


# ------------------------------------------------- against transformers' processor

CHECK = textwrap.dedent(r'''
    import io, json, sys, types
    sys.path.insert(0, sys.argv[3])
    import gpu_paths, served_requests as sr

    sys.path.insert(0, sys.argv[4])
    from torchvision_cpu import torchvision_without_ops
    torchvision_without_ops()
    from PIL import Image
    from transformers import AutoProcessor, AutoTokenizer
    lm_dir = sys.argv[1]
    reqs = [sr.Req(**d) for d in json.loads(open(sys.argv[2]).read())]
    tok = AutoTokenizer.from_pretrained(lm_dir)
    proc = AutoProcessor.from_pretrained(lm_dir)
    template = open(lm_dir + "/chat_template.jinja").read()
    vision = sr.Vision()
    res = {"soft": {}, "requests": []}
    for name, image in sr.IMAGES.items():
        img = Image.open(io.BytesIO(sr.png(image)))
        res["soft"][name] = [int(proc.image_processor(img, return_tensors="pt")["num_soft_tokens_per_image"][0]),
                             sr.soft_tokens(image, vision), list(img.size), img.mode]
    for r in reqs:
        if not r.images:
            continue
        hf = tok.apply_chat_template(sr.template_messages(r.messages), add_generation_prompt=True, tokenize=False)
        mine = sr.render(template, r.messages)
        images = [Image.open(io.BytesIO(sr.png(sr.IMAGES[n]))) for n in r.images]
        ids = proc(text=hf, images=images, return_tensors="pt")["input_ids"][0].tolist()
        boi = [i for i, t in enumerate(ids) if t == vision.boi_id]
        eoi = [i + 1 for i, t in enumerate(ids) if t == vision.eoi_id]
        local = sr.expanded_spans(sr.local_tokenizer(lm_dir)(r.messages), [sr.IMAGES[n] for n in r.images], vision)
        res["requests"].append({"id": r.id, "same_prompt": hf == mine, "hf_spans": list(zip(boi, eoi)),
                                "local_spans": local, "hf_len": len(ids)})
    print(json.dumps(res))
''')


@pytest.mark.network  # Pillow and torchvision are pip-installed into the cache once
def test_images_and_spans_match_transformers_gemma4_processor(made, model_dir, tmp_path):
    from tests.unit.test_gpu_lm_files import _vision_deps

    reqs, _, _ = made
    (tmp_path / "reqs.json").write_text(sr.dumps(reqs))
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = os.pathsep.join([str(p) for p in _vision_deps()] + [env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", CHECK, str(model_dir), str(tmp_path / "reqs.json"), str(GPU_DIR),
                           str(Path(__file__).parent)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    for name, (hf, mine, size, mode) in res["soft"].items():
        assert hf == mine, (name, hf, mine)
        assert tuple(size) == (sr.IMAGES[name].width, sr.IMAGES[name].height) and mode == "RGB"
    assert len(res["requests"]) == 12  # every request with an image
    for r in res["requests"]:
        assert r["same_prompt"], r["id"]
        assert [tuple(s) for s in r["hf_spans"]] == [tuple(s) for s in r["local_spans"]], r


def test_a_benchmark_run_in_a_call_of_its_own_joins_the_dflash_row(made):
    reqs, vision, _ = made
    phases = _phases(reqs, vision)
    phases["dflash"].pop("bench")
    phases["dflash"]["bench_skipped"] = "deadline: 120 s left, the benchmark needs about 200"
    row = report.rows({"dflash": phases["dflash"]})[0]
    assert row["bench"] is None and row["bench_skipped"].startswith("deadline")
    phases["bench"] = {"server": "bench", "bench": "tests/gpu/results/served-bench-0.21.0.json",
                       "bench_summary": [{"workload": "random", "concurrency": 1}], "started_by": "launcher serve x"}
    row = report.rows(phases)[1]
    assert row["server"] == "dflash" and row["bench"].endswith("served-bench-0.21.0.json")
    assert row["bench_skipped"] is None and row["bench_summary"][0]["workload"] == "random"


def test_extra_sets_and_vllm_args_reach_every_server():
    args = served.serve_args("reference", "/m", "/d", 8001, ["serve.max_num_seqs=8"], ["--enforce-eager"])
    cut = args.index("--")
    assert args[cut - 2:cut] == ["--set", "serve.max_num_seqs=8"] and args[-1] == "--enforce-eager"


def test_rows_of_another_vllm_stay_in_the_record(made, tmp_path):
    reqs, vision, _ = made
    out = tmp_path / "out"
    out.mkdir()
    (out / "served.json").write_text(json.dumps({"servers": [{"server": "dflash", "vllm": "0.33.0"},
                                                             {"server": "dflash", "vllm": "0.21.0", "old": 1}]}))
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "stock.json").write_text(json.dumps(_phases(reqs, vision)["stock"]))
    doc = served.assemble(tmp_path / "work", out, {})
    # A folder holding the stock phase alone replaces the stock row only.
    assert [(r["server"], r["vllm"]) for r in doc["servers"]] == [("dflash", "0.33.0"), ("dflash", "0.21.0"),
                                                                   ("stock", "0.21.0")]
    assert doc["servers"][1]["old"] == 1


def test_remote_sh_calls_served_py_with_flags_it_knows():
    import re

    text = (GPU_DIR / "remote.sh").read_text()
    body = text[text.index("\nserved_run() {"):text.index("\n}\n", text.index("\nserved_run() {"))]
    call = body[body.index('"$PY" tests/gpu/runs/served.py'):body.index("\n    tar ")]
    # The call, and the flags the body adds to it through extra+=(...).
    added = " ".join(line for line in body.splitlines() if "extra+=" in line)
    flags = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", call + " " + added))
    known = {o for a in served.build_parser()._actions for o in a.option_strings}
    assert flags <= known, flags - known
    assert {"--phases", "--model", "--drafter", "--site-patched", "--site-stock", "--work", "--out"} <= flags
    assert "    served) served ;;" in text and "    served-all) served_all ;;" in text
    # Both releases go through the one runner, each with its own site, patched copy and folder
    # (served-all's jobs through the served-run verb: served_all.Sites).
    assert 'served_run "$SITE" "$SITE_PATCHED" served\n' in text
    assert '    served-run) served_run "$@" ;;\n' in text
    import served_all

    sites = served_all.Sites("/s", "/p", "/s33", "/p33", "/rev")
    assert sites.of("0.33.0")[:3] == ("/s33", "/p33", "served-v33") and sites.of("0.21.0")[:3] == ("/s", "/p", "served")
    # served-all: every job on its own port base (8000 + 100 i), wider than a job's phase ports.
    assert served_all.PORT_STEP > max(served.PORT_OFFSETS.values())
    ports = [j.env(sites)["SERVED_PORT_BASE"] for j in served_all.plan("a:x b:y", "0.21.0 0.33.0", [])]
    assert ports == ["8000", "8100", "8200", "8300"]
    both = text[text.index("\nserved_all() {"):text.index("\nserved_run() {")]
    assert "--parallel" in call and "--port-base" in call and "--kv-cache-memory-bytes=" in both


def test_requests_after_the_deadline_are_skipped_not_sent(made):
    reqs, _, _ = made
    import time

    outs = served.run_level("http://127.0.0.1:9", "gemma4", reqs[:3], 2, deadline=time.time() - 1)
    assert [o["error"] for o in outs] == ["skipped: deadline"] * 3 and [o["id"] for o in outs] == [r.id for r in reqs[:3]]
    verdict = report.judge([_out(r.id, r.kind, [1]) for r in reqs[:3]], outs)
    assert not verdict["lossless"] and len(verdict["errors"]) == 3


def test_exact_numerics_reach_every_server_and_the_record(model_dir, monkeypatch, tmp_path):
    """--exact-numerics: VLLM_BATCH_INVARIANT=1 in every launcher's environment and the eager
    compile backend after `--`, and the launcher still plans the server with no blocking reason."""
    from launcher.checks import resolve
    from launcher.plan import Request
    from tests.unit.conftest import H100, make_ctx

    monkeypatch.setenv("MODELS_DIR", str(tmp_path))
    # Set here (not deleted) so that monkeypatch restores the environment after main() sets it.
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "0")
    args = served.serve_args("dflash", str(model_dir), str(model_dir), 8000, [], served.EXACT_ARGS)
    cut = args.index("--")
    sets = [args[i + 1] for i, a in enumerate(args[:cut]) if a == "--set"]
    plan = resolve(Request("gemma4-moe-dflash", model=str(model_dir), vllm_version="0.21.0", test_gpu=True,
                           sets=sets, extra_args=args[cut + 1:]), make_ctx(H100, vllm="0.21.0", transformers="5.13.1"))
    assert plan.argv[plan.argv.index("--compilation-config") + 1] == '{"backend": "eager"}'
    assert [r.message for r in plan.reasons if r.blocking and r.area not in ("checkpoint", "drafter")] == []
    out = tmp_path / "out"
    served.main(["--model", str(model_dir), "--drafter", str(model_dir), "--site-patched", "/nonexistent",
                 "--work", str(tmp_path / "work"), "--out", str(out), "--exact-numerics", "--assemble-only"])
    assert served.launcher_env("/site")["VLLM_BATCH_INVARIANT"] == "1"
    assert json.loads((out / "served.json").read_text())["meta"]["numerics"].startswith("exact")


def test_each_finished_phase_comes_back_raw_for_the_next_machine(model_dir, monkeypatch, tmp_path):
    """A call cut short by its time limit still returns the phases that finished, raw, under
    OUT/served-raw/ (remote.sh served seeds them from .stage/served-raw on the next machine)."""
    work, out = tmp_path / "work", tmp_path / "out"

    def fake_reference(args):
        (args.work / "reference.json").write_text(json.dumps({"server": "reference", "passes": [[{"id": "t1"}]]}))
        (args.work / "reference.log").write_text("vLLM said\n")

    monkeypatch.setitem(served.PHASES, "reference", fake_reference)
    served.main(["--model", str(model_dir), "--drafter", str(model_dir), "--site-patched", "/nonexistent",
                 "--work", str(work), "--out", str(out), "--phases", "reference"])
    assert (out / "served-raw" / "reference.json").read_bytes() == (work / "reference.json").read_bytes()
    assert (out / "served-raw" / "reference.log").read_text() == "vLLM said\n"
    assert not (out / "served-raw" / "dflash.json").exists()


def test_remote_sh_seeds_staged_served_phases_without_replacing_its_own(tmp_path):
    import subprocess

    stage, work = tmp_path / "stage", tmp_path / "work"
    (stage / "served-raw").mkdir(parents=True)
    (stage / "served-raw" / "reference.json").write_text("seeded")
    (stage / "served-raw" / "dflash.json").write_text("seeded")
    (work / "served").mkdir(parents=True)
    (work / "served" / "dflash.json").write_text("this machine's")
    text = (GPU_DIR / "remote.sh").read_text()
    body = text[text.index("\nseed_raw() {"):text.index("\n}\n", text.index("\nseed_raw() {")) + 3]
    script = f'STAGE={stage}\nWORK={work}\n{body}\nseed_raw served-raw "$WORK/served" .json\n'
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
    assert (work / "served" / "reference.json").read_text() == "seeded"
    assert (work / "served" / "dflash.json").read_text() == "this machine's"
    assert "seeded raw record: reference.json" in done.stdout
    # seeded.txt names the copies only: realshape.merge never lets one replace a newer record
    assert (work / "served" / "seeded.txt").read_text() == "reference.json\n"
    assert "dflash.json" not in done.stdout
    subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)  # a second seed
    assert (work / "served" / "seeded.txt").read_text() == "reference.json\n"


def test_the_text_only_recipe_is_sent_only_requests_without_images(model_dir, made):
    reqs, _, _ = served.inputs(model_dir, 2560, {"argv": ["vllm", "serve", "m", "--language-model-only"]})
    assert reqs and all(not r.images for r in reqs)
    assert {r.kind for r in reqs} == {"text", "tool", "stream"} and len(reqs) == 10
    assert [r.id for r in reqs] == [r.id for r in made[0] if not r.images]  # the same requests, images left out
    assert len(made[0]) == 22 and any(r.images for r in made[0])  # the multimodal recipe's stay whole
    assert report.images_change_output([], reqs) == {"value": None, "pairs": {}}
    args = served.serve_args("dflash", "/m", "/d", 8000, recipe="gemma4-moe-dflash-text")
    assert args[args.index("--recipe") + 1] == "gemma4-moe-dflash-text"


def test_rows_of_another_recipe_stay_and_rows_of_this_one_are_replaced(made, tmp_path):
    reqs, vision, _ = made
    out, work = tmp_path / "out", tmp_path / "work"
    out.mkdir()
    work.mkdir()
    (out / "served.json").write_text(json.dumps({"servers": [
        {"server": "dflash", "vllm": "0.21.0", "recipe": "gemma4-moe-dflash-text"},
        {"server": "dflash", "vllm": "0.21.0", "recipe": "gemma4-moe-dflash", "old": 1},
        {"server": "reference", "vllm": "0.21.0"},  # written before rows named their recipe: the default's
    ]}))
    (work / "stock.json").write_text(json.dumps(_phases(reqs, vision)["stock"]))
    doc = served.assemble(work, out, {})
    assert [(r["server"], r.get("recipe")) for r in doc["servers"]] == \
        [("dflash", "gemma4-moe-dflash-text"), ("dflash", "gemma4-moe-dflash"), ("reference", None),
         ("stock", "gemma4-moe-dflash")]


def test_a_folders_rows_replace_the_same_servers_in_place():
    """Issue: a call that ran the speed phase alone must keep the reference and DFlash rows of its
    release and recipe; a rerun DFlash phase takes its row's place."""
    earlier = [{"server": s, "vllm": "0.21.0", "recipe": "gemma4-moe-dflash", "n": 0}
               for s in ("reference", "dflash", "stock")]
    merged = served.merge_rows(earlier, [{"server": "speed", "vllm": "0.21.0", "recipe": "gemma4-moe-dflash"}])
    assert [r["server"] for r in merged] == ["reference", "dflash", "stock", "speed"]
    merged = served.merge_rows(merged, [{"server": "dflash", "vllm": "0.21.0", "recipe": "gemma4-moe-dflash", "n": 1}])
    assert [(r["server"], r.get("n")) for r in merged] == [("reference", 0), ("dflash", 1), ("stock", 0),
                                                           ("speed", None)]


def test_a_row_made_only_of_seeded_phases_replaces_no_row(model_dir, tmp_path):
    """The served twin of realshape's seeded-reference rule: a reference phase seeded from an
    earlier machine (seed_raw lists it in seeded.txt) judges this call's DFlash phase, but its row
    must not replace the record's reference row, which a later machine may have written."""
    reqs, vision, _ = served.inputs(model_dir, 2560)
    phases = _phases(reqs, vision)
    out, work = tmp_path / "out", tmp_path / "work"
    out.mkdir()
    work.mkdir()
    newer = {"server": "reference", "vllm": phases["reference"]["vllm"], "recipe": "gemma4-moe-dflash", "newer": True}
    (out / "served.json").write_text(json.dumps({"servers": [newer]}))
    for name in ("reference", "dflash"):
        (work / f"{name}.json").write_text(json.dumps(phases[name]))
    (work / "seeded.txt").write_text("reference.json\n")
    doc = served.assemble(work, out, {})
    assert [r["server"] for r in doc["servers"]] == ["reference", "dflash"]
    assert doc["servers"][0].get("newer") is True  # kept, not replaced by the seeded phase's row
    # Run here, the same phase is this machine's (Phase.save takes it off the list), and replaces it.
    phase = served.Phase.__new__(served.Phase)  # save() needs only its name, folder and record
    phase.name, phase.work, phase.record = "reference", work, phases["reference"]
    phase.save()
    doc = served.assemble(work, out, {})
    assert "newer" not in doc["servers"][0] and (work / "seeded.txt").read_text() == ""


def test_the_record_names_the_trained_drafter_it_served(model_dir, tmp_path):
    drafter = tmp_path / "dflash-r5-trained"
    drafter.mkdir()
    (drafter / "drafter-train-record.json").write_text(json.dumps({"drafter_sha256": "d" * 64}))
    out = tmp_path / "out"
    served.main(["--model", str(model_dir), "--drafter", str(drafter), "--site-patched", "/nonexistent",
                 "--work", str(tmp_path / "work"), "--out", str(out), "--assemble-only"])
    assert json.loads((out / "served.json").read_text())["meta"]["drafter_sha256"] == "d" * 64
    served.main(["--model", str(model_dir), "--drafter", str(model_dir), "--site-patched", "/nonexistent",
                 "--work", str(tmp_path / "work"), "--out", str(out), "--assemble-only"])
    assert json.loads((out / "served.json").read_text())["meta"]["drafter_sha256"] is None


def test_the_stock_server_is_sent_the_first_image_or_text_only_the_first_text(made):
    reqs = made[0]
    assert reqs[0].id == "text-0"  # the list starts with text: the probe must not just take the first
    assert served.stock_probe(reqs).id == "image-first" and served.stock_probe(reqs).images
    assert served.stock_probe([r for r in reqs if not r.images]).id == "text-0"


def test_numerics_are_read_off_records_that_did_not_keep_them():
    exact_argv = ["vllm", "serve", "--compilation-config", '{"backend": "eager"}']
    plan = {"env": {"VLLM_BATCH_INVARIANT": "1"}}
    assert report._numerics(plan, exact_argv) == "exact"
    assert report._numerics({"env": {}}, exact_argv) == "default"
    assert report._numerics(plan, ["vllm", "serve"]) == "default"
    assert report._numerics(plan, None) is None
    row = report.stock_row({"server": "stock", "plan": plan, "argv": exact_argv})
    assert row["numerics"] == "exact"
    assert report.stock_row({"server": "stock", "plan": plan, "argv": exact_argv, "numerics": "default"})["numerics"] == "default"


def _served_all_script(tmp_path, jobs: str, versions: str | None = None,
                       gpus: str | None = None, served_run: str | None = None) -> subprocess.CompletedProcess:
    """remote.sh's served_all with its collaborators stubbed (prepare and reverted_site as shell
    functions; each job's ``served-run SITE PATCHED NAME`` a script that records its arguments, or
    whose body is ``served_run``): the job checks, the runs started (served_all.py), and what they
    leave, without vLLM."""
    text = (GPU_DIR / "remote.sh").read_text()

    def fn(name):
        start = text.index(f"\n{name}() {{")
        return text[start:text.index("\n}\n", start) + 3]

    site = tmp_path / "site" / "vllm" / "vllm_flash_attn"
    site.mkdir(parents=True)
    (site / "_vllm_fa2_C.abi3.so").write_text("")
    record = ('echo "run $3 $SERVED_RECIPE $SERVED_PHASES ${SERVED_EXACT:-unset} $SERVED_PORT_BASE'
              '${SERVED_VARIANT:+ [$SERVED_VARIANT] $1 $2}${CUDA_VISIBLE_DEVICES:+ gpu$CUDA_VISIBLE_DEVICES}" >> "$WORK/runs"')
    (tmp_path / "served-run.sh").write_text("set -eu\n" + (served_run or record) + "\n")
    stubs = 'prepare() { :; }\nrequire_fa2() { :; }\nreverted_site() { echo "revert $1 $2" >> "$WORK/reverted"; }\n'
    env = (f'export WORK={tmp_path}/work OUT={tmp_path}/out\nSITE={tmp_path}/site\nSERVED_JOB_STAGGER_S=0\n'
           f'PY={sys.executable}\nSERVED_RUN="bash {tmp_path}/served-run.sh"\n'
           'SITE_PATCHED=/p SITE33=/s33 SITE33_PATCHED=/p33 REVERTED_SITES=/rev\n')
    env += f"SERVED_JOBS='{jobs}'\n" + (f"SERVED_VERSIONS='{versions}'\n" if versions else "")
    env += f"SERVED_GPUS='{gpus}'\n" if gpus else ""
    script = "set -euo pipefail\n" + env + "mkdir -p $WORK\n" + stubs + fn("served_all") + "served_all\n"
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, cwd=GPU_DIR.parents[1])


def test_served_all_starts_each_job_on_each_release_with_its_numerics(tmp_path):
    done = _served_all_script(tmp_path, "gemma4-moe-dflash:bench:exact gemma4-moe-dflash-text:dflash,reference:default")
    assert done.returncode == 0, done.stderr
    runs = sorted((tmp_path / "work" / "runs").read_text().splitlines())
    assert runs == ["run served gemma4-moe-dflash bench 1 8000", "run served gemma4-moe-dflash-text dflash,reference 0 8200",
                    "run served-v33 gemma4-moe-dflash bench 1 8100",
                    "run served-v33 gemma4-moe-dflash-text dflash,reference 0 8300"]


@pytest.mark.parametrize("jobs, versions, why", [
    ("gemma4-moe-dflash:bench:exact gemma4-moe-dflash:dflash:exact", None, "names a recipe twice"),
    ("gemma4-moe-dflash:speed:default", None, "the speed phase runs alone"),
    ("gemma4-moe-dflash:speed gemma4-moe-dflash-text:dflash", "0.21.0", "the speed phase runs alone"),
])
def test_served_all_refuses_jobs_that_would_collide_or_share_a_speed_measurement(tmp_path, jobs, versions, why):
    done = _served_all_script(tmp_path, jobs, versions)
    assert done.returncode == 2 and why in done.stderr
    assert not (tmp_path / "work" / "runs").exists()


def test_served_all_serves_a_series_less_one_patch_from_a_tree_built_before_the_jobs(tmp_path):
    jobs, versions = ("gemma4-moe-dflash:conformance-twin,conformance:exact",
                      "0.21.0 0.21.0-without-dflash-drafter-per-layer-attention")
    # the conformance phase reads z-lab's record ($OUT/zlab-reference.json) at its start: none, no start
    early = _served_all_script(tmp_path / "early", jobs, versions)
    assert early.returncode == 2 and "remote.sh zlab-reference" in early.stderr
    assert not (tmp_path / "early" / "work" / "runs").exists()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "zlab-reference.json").write_text("{}")
    done = _served_all_script(tmp_path, jobs, versions)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "work" / "reverted").read_text() == "revert 0.21.0 dflash-drafter-per-layer-attention\n"
    site = tmp_path / "site"
    assert sorted((tmp_path / "work" / "runs").read_text().splitlines()) == [
        "run served gemma4-moe-dflash conformance-twin,conformance 1 8000",
        "run served-0.21.0-without-dflash-drafter-per-layer-attention gemma4-moe-dflash conformance-twin,conformance "
        f"1 8100 [without dflash-drafter-per-layer-attention] {site} /rev/0.21.0/dflash-drafter-per-layer-attention"]


def test_served_all_puts_each_job_on_its_gpu_and_then_speed_runs_once_per_gpu(tmp_path):
    done = _served_all_script(tmp_path, "gemma4-moe-dflash:speed:default", "0.21.0 0.33.0", gpus="0,1")
    assert done.returncode == 0, done.stderr
    assert sorted((tmp_path / "work" / "runs").read_text().splitlines()) == [
        "run served gemma4-moe-dflash speed 0 8000 gpu0", "run served-v33 gemma4-moe-dflash speed 0 8100 gpu1"]
    crowded = _served_all_script(tmp_path / "crowded", "gemma4-moe-dflash:speed:default",
                                 "0.21.0 0.33.0 0.21.0-without-dflash-drafter-per-layer-attention", gpus="0,1")
    assert crowded.returncode == 2 and "one job and version per GPU" in crowded.stderr


def test_served_all_runs_the_speed_phase_alone_on_one_release(tmp_path):
    done = _served_all_script(tmp_path, "gemma4-moe-dflash:speed:default", "0.21.0")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "work" / "runs").read_text().splitlines() == ["run served gemma4-moe-dflash speed 0 8000"]


def test_rows_kept_from_an_earlier_call_keep_the_drafter_that_call_served(tmp_path):
    earlier = {"meta": {"target_sha256": "9ee9", "drafter_sha256": "0d50"},
               "servers": [{"vllm": "0.21.0", "recipe": "gemma4-moe-dflash", "server": "dflash", "lossless": True},
                           {"vllm": "0.21.0", "recipe": "gemma4-moe-dflash", "server": "reference"}]}
    mine = [{"vllm": "0.33.0", "recipe": "gemma4-moe-dflash-text", "server": "dflash", "lossless": True}]
    rows = served.merge_rows(served.stamp_models(earlier["servers"], earlier["meta"]),
                             served.stamp_models(mine, {"target_sha256": "9ee9", "drafter_sha256": "d46b"}))
    assert [(r["server"], r["vllm"], r.get("drafter_sha256")) for r in rows] == [
        ("dflash", "0.21.0", "0d50"), ("reference", "0.21.0", None), ("dflash", "0.33.0", "d46b")]
    assert all(r["target_sha256"] == "9ee9" for r in rows)
    # a row that names its drafter keeps it under a later call's meta
    assert served.stamp_models([dict(rows[0])], {"drafter_sha256": "ffff"})[0]["drafter_sha256"] == "0d50"


def test_phases_saving_side_by_side_each_take_their_name_off_the_seeded_list(tmp_path):
    """served.py --parallel saves phases from threads in one folder: no name a phase took off
    may come back, none left on may go."""
    import threading

    names = [f"p{i}.json" for i in range(16)]
    (tmp_path / "seeded.txt").write_text("".join(f"{n}\n" for n in names + ["kept.json"]))
    threads = [threading.Thread(target=served.seeded.unseed, args=(tmp_path, n)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert served.seeded.names(tmp_path) == {"kept.json"}


def test_the_served_table_marks_stale_rows_and_consults_the_gate():
    """Issue 51: a row on the current series reads "current", one on another series "stale"; the
    gate is applied to the stored blocks as they stand (a block from before the loop check is not
    proof, whatever ``passes`` it stored)."""
    from launcher.patching.series import series_for

    import gate

    current = series_for("0.21.0").hash
    good = gate.nondegenerate([{"token_ids": list(range(i * 128, (i + 1) * 128))} for i in range(32)])
    old = {k: good[k] for k in ("sequences", "constant_sequences", "median_distinct_fraction",
                                "near_ties", "nan_positions")}
    doc = {"servers": [
        {"server": "reference", "vllm": "0.21.0", "series": current, "nondegenerate": good},
        {"server": "dflash", "vllm": "0.21.0", "series": "f" * 64,
         "nondegenerate": {"reference": old, "dflash": good, "passes": True}},
    ]}
    md = report.markdown(doc)
    ref_line = next(ln for ln in md.splitlines() if ln.startswith("| reference |"))
    dfl_line = next(ln for ln in md.splitlines() if ln.startswith("| dflash |"))
    assert "| current |" in ref_line and "| passes |" in ref_line
    assert "| **stale** |" in dfl_line and "**not proof**: reference: loops not counted" in dfl_line
    assert "**1 of 2 rows are stale**" in md and "**1 of 2 rows with output fail the gate" in md


def _conformance_ph(tmp_path, last_request: float):
    """A stand-in for served.Phase with only what the conformance helpers read (no server here)."""
    import types

    return types.SimpleNamespace(url="http://127.0.0.1:9", last_request=last_request, work=tmp_path)


def test_the_batched_pass_skips_every_prompt_after_the_deadline(tmp_path):
    import time

    prompts = [{"token_ids": [1, 2], "max_tokens": 4}] * 3
    rows = served.batched_rows(_conformance_ph(tmp_path, time.time() - 1), "gemma4", prompts)
    assert rows == [{"error": "skipped: deadline"}] * 3


def test_the_conformance_phase_waits_for_this_calls_twin_and_not_an_older_one(tmp_path):
    import time
    import types

    twin = tmp_path / "conformance-twin.json"
    twin.write_text(json.dumps({"rows": [{"token_ids": [1]}]}))
    args = types.SimpleNamespace(phases="conformance", started=time.time() + 3600)
    # A twin this call does not run: an earlier one (seeded) is the one to use
    assert served.wait_for_twin(args, twin, _conformance_ph(tmp_path, time.time() + 60))
    # A twin this call runs: a record older than the call is not it (no wait past the deadline)
    args.phases = "conformance-twin,conformance"
    assert not served.wait_for_twin(args, twin, _conformance_ph(tmp_path, time.time() - 1))
    args.started = 0.0
    assert served.wait_for_twin(args, twin, _conformance_ph(tmp_path, time.time() + 60))
    twin.write_text(json.dumps({"started": False}))  # this call's twin never started: no prefixes
    assert not served.wait_for_twin(args, twin, _conformance_ph(tmp_path, time.time() + 60))


def test_the_drafters_window_is_read_as_vllm_reads_it(tmp_path):
    cfg = {"num_hidden_layers": 2, "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 256}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert served.drafter_window(tmp_path) == 256
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "layer_types": ["full_attention"] * 2}))
    assert served.drafter_window(tmp_path) is None


def test_a_series_variant_is_recorded_and_keys_its_own_row():
    rows = served.merge_rows([{"vllm": "0.21.0", "recipe": "gemma4-moe-dflash", "server": "speed", "old": 1}],
                             [{"vllm": "0.21.0", "recipe": "gemma4-moe-dflash", "server": "speed",
                               "variant": "without dflash-drafter-per-layer-attention"}])
    assert [r.get("variant") for r in rows] == [None, "without dflash-drafter-per-layer-attention"]
    assert "--variant" in {o for a in served.build_parser()._actions for o in a.option_strings}


def test_served_all_leaves_at_most_eight_files_in_out_keeping_the_record_apart(tmp_path):
    # The stub runs write what real jobs leave: raw folders, logs, benchmark files.
    leaves = ('mkdir -p "$OUT/$3-raw"; for f in a.json a.log b.json b.log; do echo x > "$OUT/$3-raw/$f"; done; '
              'echo x > "$OUT/$3-logs.tar.gz"; echo x > "$OUT/served-bench-$3.json"; echo r > "$OUT/served.json"; '
              'echo m > "$OUT/served.md";')
    done = _served_all_script(tmp_path, "gemma4-moe-dflash:reference:exact", served_run=leaves)
    assert done.returncode == 0, done.stderr
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["served-out.tar.gz", "served.json", "served.md"]
    import tarfile

    with tarfile.open(out / "served-out.tar.gz") as tar:
        names = set(tar.getnames())
    assert {"served-raw/a.json", "served-v33-raw/b.log", "served-bench-served.json", "served-all-logs.tar.gz"} <= names


def test_the_log_summary_names_only_what_this_command_ran(model_dir, monkeypatch, tmp_path, capsys):
    """served.json keeps the rows of earlier runs; the summary a run prints must not pass them
    off as its own (a twin-only run once printed DFlash and stock rows from the record)."""
    work, out = tmp_path / "work", tmp_path / "out"
    out.mkdir()
    earlier = {"meta": {}, "servers": [{"server": "dflash", "started": True, "acceptance_length": 2.83,
                                        "stock_error": None, "lossless": True}]}
    (out / "served.json").write_text(json.dumps(earlier))

    def fake_twin(args):
        (args.work / "conformance-twin.json").write_text(json.dumps(
            {"server": "conformance-twin", "started": True, "ready_s": 41.0, "rows": [{"id": "p0"}, {"id": "p1"}]}))

    monkeypatch.setitem(served.PHASES, "conformance-twin", fake_twin)
    served.main(["--model", str(model_dir), "--drafter", str(model_dir), "--site-patched", "/nonexistent",
                 "--work", str(work), "--out", str(out), "--phases", "conformance-twin"])
    printed = capsys.readouterr().out.splitlines()
    summary = [line for line in printed if ": started=" in line or ": no record" in line]
    assert summary == ["conformance-twin: started=True ready_s=41.0 prompts=2 lossless=None acceptance=None "
                       "stock_error=None"]
    # a phase that left no record says so instead of vanishing from the log
    assert served.ran_summary(work, ["reference"]) == [f"reference: no record in {work}"]


def test_the_conformance_phase_refuses_to_start_without_z_labs_record(model_dir, monkeypatch, tmp_path, capsys):
    """Whichever verb starts it (served-all, served, served-run): without z-lab's record no prompt
    would be served again stopped at its prefix, silently."""
    started = []
    # the phase itself serves vLLM on a GPU: a stand-in records only that it was started
    monkeypatch.setitem(served.PHASES, "conformance", lambda args: started.append(args))
    argv = ["--model", str(model_dir), "--drafter", str(model_dir), "--site-patched", "/nonexistent",
            "--work", str(tmp_path / "work"), "--out", str(tmp_path / "out"), "--phases", "conformance"]
    for extra in ([], ["--zlab", str(tmp_path / "zlab-reference.json")]):
        with pytest.raises(SystemExit) as exc:
            served.main([*argv, *extra])
        assert exc.value.code == 2 and "remote.sh zlab-reference" in capsys.readouterr().err
    assert started == []
    (tmp_path / "zlab-reference.json").write_text("{}")
    served.main([*argv, "--zlab", str(tmp_path / "zlab-reference.json")])
    assert len(started) == 1


def test_a_phase_record_names_the_target_it_serves_and_the_drafter_only_where_it_serves_one(tmp_path):
    """The conformance page took both hashes from z-lab's record alone: nothing showed that the
    servers ran that drafter. The train records beside the models give them."""
    import types

    target, drafter = tmp_path / "target", tmp_path / "drafter"
    target.mkdir()
    drafter.mkdir()
    (target / "train-record.json").write_text(json.dumps({"target_sha256": "t" * 64}))
    (drafter / "drafter-train-record.json").write_text(json.dumps({"drafter_sha256": "d" * 64}))
    args = types.SimpleNamespace(deadline=0, work=tmp_path / "work", port_base=8000, model=target, drafter=drafter,
                                 set=[], vllm_arg=[], recipe="gemma4-moe-dflash", series_hash="s", variant=None,
                                 exact_numerics=True)
    with_drafter = served.Phase("conformance", args, "/site").record
    twin = served.Phase("conformance-twin", args, "/site").record
    assert (with_drafter["target_sha256"], with_drafter["drafter_sha256"]) == ("t" * 64, "d" * 64)
    assert twin["target_sha256"] == "t" * 64 and "drafter_sha256" not in twin


def _bench_doc(outputs_c1: list | None, prompts: int) -> dict:
    run = {"workload": "prompts", "concurrency": 1, **({"outputs": outputs_c1} if outputs_c1 is not None else {})}
    return {"prompts_file": {"prompts": prompts}, "runs": [run, {"workload": "prompts", "concurrency": 4}]}


def test_the_speed_gate_judges_what_each_speed_server_said_and_catches_loops(tmp_path):
    """Issue 51: the speed-up stands only on output that passes the gate. Built here: 36 prompts
    of 128 distinct-enough tokens, of which the DFlash side's prompts 3, 7, 11 and 20 end in a
    cycle of period 4 (the kind of output a drafter finds easy): 4 of 36 is over the gate's 10 %."""
    def fresh(i):
        return [(i * 131 + j * j * 7) % 4001 for j in range(128)]

    def looping(i):
        return fresh(i)[:60] + [5, 6, 7, 8] * 17

    clean = [fresh(i) for i in range(36)]
    loops = [looping(i) if i in (3, 7, 11, 20) else fresh(i) for i in range(36)]
    (tmp_path / "without.json").write_text(json.dumps(_bench_doc(clean, 36)))
    (tmp_path / "with.json").write_text(json.dumps(_bench_doc(loops, 36)))
    block = served.speed_gate(tmp_path / "with.json", tmp_path / "without.json", 36)
    assert block["reference"]["looping_sequences"] == 0 and report.gate.passes(block["reference"])
    assert block["dflash"]["looping_sequences"] == 4 and block["dflash"]["looping_prompts"] == [3, 7, 11, 20]
    assert block["dflash"]["prompts_full_length"] == 36
    assert report.gate_failures(block) == ["dflash: 4 of 36 sequences looping (at most 10%)"]
    # a row carrying it is judged in the headline: not proof
    row = report.speed_row({"server": "speed-dflash", "speed_gate": block, "bench_comparison": []}, None)
    assert report.gate_failures(row["nondegenerate"]) == ["dflash: 4 of 36 sequences looping (at most 10%)"]


def test_the_speed_gate_is_absent_where_outputs_were_not_recorded_and_counts_prompts_not_requests(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps(_bench_doc(None, 36)))
    (tmp_path / "b.json").write_text(json.dumps(_bench_doc([[1, 2, 3] * 50] * 40, 20)))
    assert served.speed_gate(tmp_path / "a.json", tmp_path / "a.json", 36) == {"reference": None, "dflash": None}
    block = served.speed_gate(tmp_path / "b.json", tmp_path / "b.json", 20)["dflash"]
    # 40 requests over 20 prompts: 20 distinct prompts, under the gate's 32
    assert block["prompts"] == 20 and "20 prompts of 128+ tokens (at least 32)" in report.gate.failures(block)


def test_a_served_run_whose_server_did_not_do_its_part_exits_non_zero_and_says_which(tmp_path, monkeypatch):
    """served.py's exit status (served_all and make gpu-served stop on it, before any merge):
    a server that did not start, an error, a phase skipped by the deadline, a speed pair not
    benched, a missing record. The stock server's failed start is its finding, not a failure."""
    def write(name, **record):
        (tmp_path / f"{name}.json").write_text(json.dumps(record))

    write("reference", started=True, rows=[{}])
    write("dflash", started=False)
    write("stock", started=False, error="partial multimodal token full attention not supported")
    assert served.failed_servers(tmp_path, ["reference", "stock"]) == []
    assert served.failed_servers(tmp_path, ["reference", "dflash", "stock"]) == [
        "dflash: did not start"]
    write("speed-reference", started=True)
    write("speed-dflash", started=True, speed_skipped="not started: speed-reference")
    assert served.failed_servers(tmp_path, ["speed"]) == ["speed-dflash: not started: speed-reference"]
    write("dflash", started=False, skipped="deadline: no time left to start a server")
    assert served.failed_servers(tmp_path, ["dflash", "bench"]) == [
        "dflash: deadline: no time left to start a server", f"bench: no record in {tmp_path}"]
    # the start limit: 480 s, or what a side-by-side form sets
    monkeypatch.delenv("SERVED_START_TIMEOUT_S", raising=False)
    assert served.start_timeout_s() == 480
    monkeypatch.setenv("SERVED_START_TIMEOUT_S", "900")
    assert served.start_timeout_s() == 900
