"""tests/gpu/runs/multinode_served.py on the CPU: the servers' launcher arguments as the real launcher
plans them, and the verdicts over made-up outputs (the servers themselves need two GPUs)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "gpu"))
import gpu_paths  # noqa: E402,F401  (the harness's group folders)

import multinode_served as mn  # noqa: E402


@pytest.fixture
def args(tmp_path):
    model = tmp_path / "target"
    model.mkdir()
    (model / "config.json").write_text("{}")
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    (drafter / "config.json").write_text(json.dumps({"num_attention_heads": 8, "num_key_value_heads": 2}))
    return mn.build_parser().parse_args(["--model", str(model), "--drafter", str(drafter), "--site", "/nowhere",
                                         "--work", str(tmp_path / "work"), "--out", str(tmp_path / "out")])


def _plan(argv: list[str], cwd: Path) -> dict:
    proc = subprocess.run([sys.executable, "-m", "launcher", *mn.served._with_flags(argv, "--dry-run", "--json")],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.stdout, proc.stderr
    return json.loads(proc.stdout)


def _value(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def test_the_two_nodes_hold_one_model_with_tensor_parallel_2_and_one_gpu_each(args, tmp_path):
    pair = mn.Pair("nodes2-dflash", args)
    assert [env["CUDA_VISIBLE_DEVICES"] for _, env in pair.plans] == ["0", "1"]
    head, worker = (_plan(argv, tmp_path)["argv"] for argv, _ in pair.plans)
    for rank, argv in enumerate((head, worker)):
        assert _value(argv, "--tensor-parallel-size") == "2"
        assert "--data-parallel-size" not in argv  # the profile's own DP 2 would be two copies
        assert (_value(argv, "--nnodes"), _value(argv, "--node-rank")) == ("2", str(rank))
        assert _value(argv, "--master-addr") == "127.0.0.1"
        assert "--speculative-config" in argv and "--no-enable-prefix-caching" in argv
    assert "--headless" in worker and "--headless" not in head
    assert _value(head, "--port") == str(args.port)
    # vLLM's custom all-reduce needs CUDA IPC, which the two-GPU host refused: NCCL on both sides
    assert "--disable-custom-all-reduce" in head and "--disable-custom-all-reduce" in worker


def test_the_one_process_servers_differ_from_the_nodes_only_in_the_layout(args, tmp_path):
    """TP 2 in one process is the reference of the two nodes: the same flags but the node ones."""
    node_only = {"--nnodes", "--node-rank", "--master-addr", "--master-port"}
    nodes = _plan(mn.Pair("nodes2", args).plans[0][0], tmp_path)["argv"]
    one = _plan(mn.Pair("tp2", args).plans[0][0], tmp_path)["argv"]
    strip = lambda argv: [x for i, x in enumerate(argv) if x not in node_only and argv[i - 1] not in node_only]
    assert sorted(strip(nodes)) == sorted(one)
    assert mn.Pair("tp2", args).plans[0][1] == {"CUDA_VISIBLE_DEVICES": "0,1"}
    tp1 = _plan(mn.Pair("tp1", args).plans[0][0], tmp_path)["argv"]
    assert "--tensor-parallel-size" not in tp1 and "--speculative-config" not in tp1


def _rows(*seqs, margins=None):
    return [{"token_ids": list(s), "margins": list(margins[i]) if margins else [1.0] * len(s)}
            for i, s in enumerate(seqs)]


def test_identical_counts_strictly_and_an_error_is_never_identical():
    a = _rows([1, 2, 3], [4, 5, 6], [7, 8, 9])
    b = _rows([1, 2, 3], [4, 5, 0], [7, 8, 9])
    b[2] = {"error": "URLError"}
    v = mn.identical(a, b)
    assert (v["identical"], v["prompts"], v["parted"]) == (1, 3, [1, 2])


def test_a_part_is_within_noise_only_below_the_percentile_of_the_moves_before_it():
    # 100 shared positions move by 0.01 (one moves by 5.0: the outlier the percentile ignores)
    ref_m = [[2.0] * 50, [2.0] * 50 + [0.005, 3.0]]
    cand_m = [[2.01] * 49 + [7.0], [2.01] * 50 + [0.0, 3.0]]
    ref = _rows([1] * 50, [2] * 50 + [3, 4], margins=ref_m)
    cand = _rows([1] * 50, [2] * 50 + [9, 4], margins=cand_m)
    v = mn.within_noise(ref, cand)
    assert v["bound"] == pytest.approx(0.01, abs=1e-9)
    assert v["parts"] == [{"prompt": 1, "position": 50, "margin": 0.005, "within_noise": True}]
    wide = _rows([1] * 50, [2] * 50 + [3, 4], margins=[[2.0] * 50, [2.0] * 50 + [0.5, 3.0]])
    assert mn.within_noise(wide, cand)["parts"][0]["within_noise"] is False


def test_the_verdicts_hold_only_on_every_prompt_and_the_page_says_so(args):
    same = _rows(*[[i, i + 1, i + 2] for i in range(4)])
    other = _rows(*[[i, i + 1, i + 2] for i in range(3)], [0, 0, 1])
    rec = {"meta": {**mn.meta(args), "gpu": "2 x H200"}, "servers": {
        "tp2": {"passes": [{"rows": same}, {"rows": same}], "ready_s": 50.0},
        "nodes2": {"passes": [{"rows": other}], "ready_s": 61.0,
                   "speed": [{"tok_s": 100.0}, {"tok_s": 300.0}, {"tok_s": 900.0}],
                   "kill": {"client_after_kill": "URLError: refused", "worker_exited": True, "worker_exit_s": 12.0,
                            "worker_exit_code": 1, "ready_s": 70.0}}}}
    v = mn.verdicts(rec)
    assert v["nodes2_vs_tp2"]["holds"] is False and v["nodes2_vs_tp2"]["identical"] == 3
    assert v["tp2_reproduces"]["identical"] == 4
    assert "gate_failures" in v and v["gate_failures"]  # 4 prompts of 3 tokens: far under the gate
    page = mn.markdown({**rec, "verdicts": v})
    assert "| nodes2 vs tp2 | 3/4 | False |" in page
    assert page.splitlines()[2] == "| what | vLLM | series | verdict | key number |"  # the headline first
    assert "| two nodes vs one TP 2 process |" in page and "| misses | 3/4 identical |" in page
    assert "| two nodes vs one TP 2 process, with the drafter |" in page and "| not run | - |" in page
    assert "exited by itself after 12.0 s" in page and "100.0, 300.0, 900.0" in page


def test_a_prompt_without_an_answer_is_never_within_noise():
    ref = _rows([1, 2, 3], [4, 5, 6])
    cand = [{"error": "URLError: refused"}, _rows([4, 5, 6])[0]]
    v = mn.within_noise(ref, cand)
    assert v["parts"] == [] and v["positions"] == 3 and (v["within_noise"], v["prompts"]) == (1, 2)
    assert mn.identical(ref, cand)["identical"] == 1  # the strict count is where the error shows


def _run(date: str, servers: dict, **meta) -> dict:
    base = {"date": date, "target_sha256": "t", "series": "s", "bars": "b", "vllm": "0.33.0", "tokens": 3,
            "numerics": "exact", "gpu": "2 x H200"}
    return {"meta": {**base, **meta}, "prompts": 2, "servers": servers}


def test_runs_merge_into_one_record_with_each_server_from_the_run_that_answered():
    rows = _rows([1, 2, 3], [4, 5, 6])
    first = _run("d0", {"tp1": {"passes": [{"rows": rows}]}, "tp2": {"error": "not ready"},
                        "tp2-dflash": {"error": "not ready"}})
    second = _run("d1", {"tp2": {"passes": [{"rows": rows}, {"rows": rows}]}, "nodes2": {"passes": [{"rows": rows}]}})
    rec = mn.merged([first, second])
    assert {n: e["run"] for n, e in rec["servers"].items()} == {"tp1": 0, "tp2": 1, "tp2-dflash": 0, "nodes2": 1}
    assert [r["date"] for r in rec["meta"]["runs"]] == ["d0", "d1"]
    v = mn.verdicts(rec)
    assert v["tp2_vs_tp1"]["strict"]["identical"] == 2 and v["nodes2_vs_tp2"]["holds"] is True
    page = mn.markdown({**rec, "verdicts": v})
    assert "run 0 at d0: tp1, tp2-dflash; run 1 at d1: tp2, nodes2" in page
    # a later failure never replaces an earlier answer
    third = _run("d2", {"tp1": {"error": "not ready"}})
    assert mn.merged([first, second, third])["servers"]["tp1"]["run"] == 0


def test_runs_of_another_target_or_series_do_not_merge():
    with pytest.raises(SystemExit, match="differ in target_sha256, series"):
        mn.merged([_run("d0", {}), _run("d1", {}, target_sha256="u", series="z")])


def test_a_drafter_server_is_taken_only_from_runs_with_the_records_drafter():
    """The record names the newest run's drafter: a -dflash server of a run with another drafter
    (the random one, before the trained drafter existed) would report the wrong drafter's acceptance."""
    rows = _rows([1, 2, 3], [4, 5, 6])
    first = _run("d0", {"tp2": {"passes": [{"rows": rows}]}, "tp2-dflash": {"passes": [{"rows": rows}]}},
                 drafter="/m/random-drafter")
    second = _run("d1", {"tp1": {"passes": [{"rows": rows}]}, "tp2-dflash": {"error": "not ready"}},
                  drafter="/m/trained-drafter")
    rec = mn.merged([first, second])
    assert rec["servers"]["tp2-dflash"] == {"error": "not ready", "run": 1}
    assert rec["servers"]["tp2"]["run"] == 0 and rec["meta"]["drafter"] == "/m/trained-drafter"


def test_runs_on_another_kind_of_gpu_do_not_merge():
    """Exact numerics give the same tokens on GPUs of one kind, not across kinds."""
    with pytest.raises(SystemExit, match="differ in gpu"):
        mn.merged([_run("d0", {}), _run("d1", {}, gpu="2 x NVIDIA H100 80GB HBM3")])


def test_merge_from_the_command_line_writes_both_files(tmp_path):
    rows = _rows([1, 2, 3], [4, 5, 6])
    paths = []
    for i, servers in enumerate(({"tp1": {"passes": [{"rows": rows}]}}, {"tp2": {"passes": [{"rows": rows}]}})):
        paths.append(tmp_path / f"run{i}.json")
        paths[-1].write_text(json.dumps(_run(f"d{i}", servers)))
    assert mn.main(["--merge", *map(str, paths), "--out", str(tmp_path / "out")]) == 0
    rec = json.loads((tmp_path / "out" / "multinode.json").read_text())
    assert rec["verdicts"]["tp2_vs_tp1"]["strict"]["identical"] == 2
    assert "| tp2 vs tp1 | 2/2 |" in (tmp_path / "out" / "multinode.md").read_text()


def test_servers_without_their_folders_are_refused_by_name(tmp_path, capsys):
    with pytest.raises(SystemExit):
        mn.main(["--out", str(tmp_path / "out"), "--model", str(tmp_path)])
    assert "the servers need --drafter, --site, --work (or --merge RECORD...)" in capsys.readouterr().err
