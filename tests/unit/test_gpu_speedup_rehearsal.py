"""The speed-up curve's run end to end on the CPU, as ``remote.sh speedup-curve`` starts it.

Stand-ins, because vLLM needs a GPU: the memory blocker (prints what mem_blocker.py prints) and
the launcher's server. The server is a small OpenAI-style process that plays a greedy target and
a speculative decoder: each request's tokens are a fixed function of its prompt, and each verify
step asks the real oracle (``tests/gpu/runs/oracle.py``, installed as the plugin would install it:
the plan file watched, ``ORACLE_PLAN_LATER=1``) for its drafts, accepts their prefix that matches
the target, and counts drafts, accepted tokens and positions on ``/metrics`` under vLLM's names.
Without a plan its drafts are never right, as a random drafter's. Everything else is real:
``speedup_curve.py run`` with its server and blocker processes, the references over HTTP, the
per-point plans and their markers, the controls, ``launcher.bench``'s client and ``/metrics``
parsing, and the record.
"""

from __future__ import annotations

import json
import shlex
import sys
import textwrap
from pathlib import Path

import pytest

from tests.integration.docker_env import free_port  # a port claimed across test workers
from tests.unit import stand_in_openai
from tests.unit.gpu_scripts import GPU_DIR, load

BLOCKER = textwrap.dedent("""\
    import json, sys, time
    leave = int(sys.argv[sys.argv.index("--leave-free") + 1])
    total = 150_000_000_000
    print(json.dumps({"event": "start", "free": total, "total": total, "device": "Stand-in H200"}), flush=True)
    print(json.dumps({"event": "holding", "held": total - leave, "free": leave, "total": total}), flush=True)
    while True:
        time.sleep(0.2)
""")

SERVER = textwrap.dedent("""\
    import json, os, sys, threading, uuid
    from pathlib import Path
    sys.path.insert(0, os.environ["GPU_DIR"])
    sys.path.insert(0, STAND_IN_DIR)
    import gpu_paths  # noqa: F401
    import oracle
    import stand_in_openai

    argv = sys.argv[1:]
    port = int(argv[argv.index("--port") + 1])
    sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    k = next((int(s.split("=")[1]) for s in sets if s.startswith("drafter.num_speculative_tokens=")), 15)
    drafting = "drafter=null" not in sets
    plan = os.environ.get("ORACLE_PLAN")
    assert not plan or os.environ.get("ORACLE_PLAN_LATER") == "1", "the curve's DFlash servers watch their plan"
    oracle_ = oracle.Oracle(oracle.empty_plan(), None, later=Path(plan)) if plan else None
    lock = threading.Lock()
    counts = {"drafts": 0, "tokens": 0, "accepted": 0, "pos": [0] * k}

    def target(prompt, n):  # the greedy target: each token a fixed function of the prompt and position
        seed = sum(prompt[-8:]) * 31 + len(prompt)
        return [1000 + (seed * 7919 + 104729 * j * j + 13 * j) % 20000 for j in range(n)]

    def generate(prompt, max_tokens):
        out, n, rid = target(prompt, max_tokens + k + 1), 1, uuid.uuid4().hex
        steps = 0
        while drafting and n < max_tokens:
            with lock:  # the engine steps one request at a time here
                row = oracle.Row(rid, tuple(prompt), len(prompt) + n - 1, 0, k if steps else 0)
                drafts = oracle_.step([row], k).get(0) if oracle_ else None
                drafts = drafts or [7] * k  # never a target token: a random drafter's
                keep = oracle_.lengths.get(0) if oracle_ else None  # tail "drafter": the rest is the drafter's
                if keep is not None:
                    drafts = drafts[:keep] + [7] * (k - keep)
                    with open(os.environ["STAND_IN_TAIL_LOG"], "a") as fh:  # what the test reads
                        fh.write(f"{keep}\\n")
                a = 0
                while a < k and drafts[a] == out[n + a]:
                    a += 1
                counts["drafts"] += 1
                counts["tokens"] += k
                counts["accepted"] += a
                for i in range(a):
                    counts["pos"][i] += 1
            n += a + 1
            steps += 1
        return out[:max_tokens]

    class H(stand_in_openai.Handler):
        def metrics(self):
            if not drafting:
                return "\\n"
            with lock:
                c = dict(counts, pos=list(counts["pos"]))
            lines = [f'vllm:spec_decode_num_drafts_total{{engine="0"}} {c["drafts"]}',
                     f'vllm:spec_decode_num_draft_tokens_total{{engine="0"}} {c["tokens"]}',
                     f'vllm:spec_decode_num_accepted_tokens_total{{engine="0"}} {c["accepted"]}']
            lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",position="{i}"}} {v}'
                      for i, v in enumerate(c["pos"])]
            return "\\n".join(lines) + "\\n"
        def do_POST(self):
            body = self.read_body()
            ids = generate(list(body["prompt"]), int(body["max_tokens"]))
            if not body.get("stream"):
                self.send_body(json.dumps({"choices": [{"text": "t", "token_ids": ids}]}))
                return
            self.stream(2, {"prompt_tokens": len(body["prompt"]), "completion_tokens": len(ids)})

    stand_in_openai.serve(port, H, 64)
""").replace("STAND_IN_DIR", repr(stand_in_openai.HERE))

ONLY = ["v0.33.0-k3-c1-a1-base", "v0.33.0-k3-c1-a2.5-base", "v0.33.0-k3-c4-a1-base", "v0.33.0-k3-c4-a4-base",
        "v0.33.0-k3-c4-a1-dtail", "v0.33.0-k3-c4-a2.5-dtail"]


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory):
    curve = load("speedup_curve")
    tmp = tmp_path_factory.mktemp("speedup-rehearsal")
    (tmp / "blocker.py").write_text(BLOCKER)
    (tmp / "server.py").write_text(SERVER)
    model = tmp / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"text_config": {"vocab_size": 262144}}))
    mp = pytest.MonkeyPatch()
    mp.setenv("GPU_DIR", str(GPU_DIR))
    mp.setenv("STAND_IN_TAIL_LOG", str(tmp / "tail-rows"))
    record = tmp / "speedup-curve.json"
    argv = ["run", "--vllm", "0.33.0", "--series-hash", "ab" * 32, "--model", str(model), "--drafter", str(tmp),
            "--launcher", shlex.join([sys.executable, str(tmp / "server.py")]),
            "--blocker", shlex.join([sys.executable, str(tmp / "blocker.py")]),
            "--refs", str(tmp / "refs"), "--work", str(tmp / "work"), "--record", str(record),
            "--port", str(free_port()), "--start-timeout-s", "60", "--only", ",".join(ONLY)]
    try:
        code = curve.main(argv)
    finally:
        mp.undo()
    return {"code": code, "record": json.loads(record.read_text()), "tmp": tmp, "curve": curve}


def test_the_run_measures_the_points_it_was_given_and_their_baselines(rehearsal):
    rec = rehearsal["record"]
    assert rehearsal["code"] == 0
    assert sorted(rec["points"]) == sorted(ONLY)
    for pid in ONLY:
        row = rec["points"][pid]
        assert row["baseline"]["successful"] == row["dflash"]["successful"] == 32, pid
        assert row["dflash"]["series"] == "ab" * 32 and row["dflash"]["refs_from"] == "k3"
        assert row["dflash"]["gather"] == "unknown"  # the stand-in drafts by the host oracle: it never says


def test_each_batch_records_how_long_its_server_took_to_start(rehearsal):
    batches = rehearsal["record"]["batches"]
    assert {b["id"] for b in batches} == {"v0.33.0-nodrafter-1", "v0.33.0-k3-c1", "v0.33.0-k3-c4"}
    for b in batches:
        assert isinstance(b["server_start"]["total_s"], float) and 0 < b["server_start"]["total_s"] < 60, b


def test_measured_acceptance_follows_each_points_own_plan(rehearsal):
    # The four points share a server and, per concurrency, their prompts: only a plan read anew
    # before each point gives each its level.
    rec = rehearsal["record"]
    for pid in ONLY:
        dflash = rec["points"][pid]["dflash"]
        level = rec["points"][pid]["level"]
        assert dflash["acceptance"]["mean_acceptance_length"] == pytest.approx(level, abs=0.02), pid
        assert dflash["off_plan"] is False


def test_each_planned_1_point_has_its_control_from_the_same_server_on_the_real_drafter(rehearsal):
    import speedup_grid as sg
    import speedup_record as srec

    rec = rehearsal["record"]
    servers = {c: {rec["points"][pid]["dflash"]["server"] for pid in ONLY if f"-c{c}-" in pid} for c in (1, 4)}
    assert [len(s) for s in servers.values()] == [1, 1]  # a DFlash server for each concurrency's batch
    assert servers[1] != servers[4]
    for pid in ("v0.33.0-k3-c1-a1-base", "v0.33.0-k3-c4-a1-base"):
        row = rec["points"][pid]
        point = sg.Point("0.33.0", 3, row["concurrency"], 1.0)
        for after in (False, True):  # timed right before the point and again right after it
            control = srec.paired_control(rec, point, after=after)
            assert control is not None and control["oracle"] == "no plan" and control["prompts_of"] == pid
            assert control["server"] == row["dflash"]["server"]
            # the stand-in drafter never guesses right: acceptance 1, as the oracle's planned 1.0
            assert control["acceptance"]["mean_acceptance_length"] == pytest.approx(1.0)
    # the control after followed the point's plan: the oracle let that plan go and said so, and
    # read the next point's plan again
    work = rehearsal["tmp"] / "work"
    assert sorted(p.name for p in work.glob("*.plan.json*")) == [
        "v0.33.0-k3-c1.plan.json", "v0.33.0-k3-c1.plan.json.adopted", "v0.33.0-k3-c1.plan.json.dropped",
        "v0.33.0-k3-c4.plan.json", "v0.33.0-k3-c4.plan.json.adopted", "v0.33.0-k3-c4.plan.json.dropped"]


def test_the_second_oracle_sets_only_the_positions_that_decide_acceptance(rehearsal):
    # Its drafts keep the real drafter's tokens past the first wrong position: at a planned 1.0
    # only that position is set, at 2.5 (first wrong at 1 or 2) the first two, or all three of
    # K 3's (no row to mark then); the plain points set all of them.
    import speedup_record as srec

    kept = sorted(set(map(int, (rehearsal["tmp"] / "tail-rows").read_text().split())))
    assert kept == [1, 2]
    rec = rehearsal["record"]
    control = rec[srec.BEFORE]["v0.33.0-k3-c4-dtail"]
    assert control["prompts_of"] == "v0.33.0-k3-c4-a1-dtail"
    assert control["server"] == rec["points"]["v0.33.0-k3-c4-a1-dtail"]["dflash"]["server"]
    for pid in ("v0.33.0-k3-c4-a1-dtail", "v0.33.0-k3-c4-a2.5-dtail"):
        assert rec["points"][pid]["baseline"]["shared_from"].endswith("-base")


def test_one_reference_set_served_each_concurrency(rehearsal):
    refs = sorted(p.name for p in (rehearsal["tmp"] / "refs").glob("*.json"))
    assert refs == ["v0.33.0-k3-c1-base.json", "v0.33.0-k3-c4-base.json"]
