"""The one command per results page: each page's fixed, ordered steps, from staging to its report.

``python tests/gpu/reports/evidence.py run PAGE..`` (``make gpu-PAGE``; ``make gpu-evidence`` runs every
page) runs, on a machine with a GPU and network, every step of the pages named, in order: staging
(``stage.py``), the GPU steps (``remote.sh`` verbs: training, or restoring a checkpoint packed
before; the runs), every merge and the report. Steps that several pages share run once.

A machine with a GPU and no network runs the same steps split at one fixed point
(``--where``): ``--where network`` on a machine with network stages every bundle as parts under
``.stage/``; the parts go into ``.stage/`` of the GPU host's checkout in any order; there
``--where gpu,cpu`` runs the rest. ``python tests/gpu/reports/evidence.py plan PAGE..`` prints the
sequence with each step's side of the split.

Every step is a command with placeholders: ``{py}`` this interpreter, ``{results}`` the folder
the pages are written to (``tests/gpu/results``), ``{work}`` the GPU host's work folder
(remote.sh's ``$WORK``; its verbs write their records under ``{work}/out``).

``replay`` (``tests/unit/test_gpu_evidence.py``) runs a page's sequence on the CPU with each GPU
step replaced by its committed raw records (the archives under ``results/`` named by the step) and
every merge and report run for real, into another folder: what the committed pages must equal.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]  # tests/gpu
REPO = HERE.parents[1]
RESULTS = HERE / "results"
WORK = Path(os.environ.get("WORK", "/tmp/gpu-proof"))
WHERE = ("network", "gpu", "cpu")  # the split's sides, in the order they run


@dataclass(frozen=True)
class Step:
    """One command of a page's sequence. ``where``: ``network`` (staging, needs network),
    ``gpu`` (a remote.sh verb on the GPU host) or ``cpu`` (a merge or report, on either).
    ``env``: variables it runs with. ``writes``: the results pages it writes. ``replay``: for a
    GPU step, the committed raw archives (under ``results/``) that stand in for it, unpacked into
    ``{work}``; ``replay_files``: files written into ``{work}`` beside them, for an input the
    archive lacks. ``gpus``: the hosts it runs on, by GPU count, where a page has one form of
    its runs for a host of one GPU and another for a host of several (``ONE_GPU``, ``GPUS_2``)."""

    name: str
    where: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    writes: tuple[str, ...] = ()
    replay: tuple[str, ...] = ()
    replay_files: tuple[tuple[str, str], ...] = ()
    gpus: tuple[int, int] = (0, 1 << 10)

    def runs_on(self, gpus: int) -> bool:
        """Whether a host with ``gpus`` GPUs runs it (a host with none counts as one: its GPU
        steps fail there as they would anywhere)."""
        return self.gpus[0] <= max(gpus, 1) <= self.gpus[1]

    def command(self, values: dict) -> list[str]:
        return [a.format(**values) for a in self.argv]

    def environ(self, values: dict) -> dict:
        return {k: v.format(**values) for k, v in self.env}


def _remote(verb: str, *env: tuple[str, str], name: str | None = None, **kw) -> Step:
    return Step(name or verb, "gpu", ("bash", "tests/gpu/remote.sh", verb), env=(("WORK", "{work}"), *env), **kw)


def _stage(name: str, *args: str) -> Step:
    return Step(name, "network", ("{py}", "tests/gpu/staging/stage.py", *args))


# 0.21.0's backport of the drafter's per-layer attention (issue 50, item 5)
PER_LAYER = "dflash-drafter-per-layer-attention"
# The conformance run's raw records: each job's folder ({work}/served*/conformance*.json) and z-lab's
# record as out/zlab-reference.json; the gated target 84c26c18 and its drafter 8db4e9f4 (the
# earlier target 083e4869's runs stay in conformance/, each listed by its earlier-*.json)
CONFORMANCE_ARCHIVE = "conformance/84c26c18/served-raw.tar.xz"
# served_gate.py's verdict on the conformance run's target: its twins, served twice, pass the gate
# on both releases and reproduce (exit 1 otherwise, which stops the page before its report)
SERVED_GATE = "conformance/served-gate.json"

# The 0.33.0 speed pair's deadline: its drafter server took 337 s and 412 s to become ready on an
# H200 (the V2 runner's kernel warmup among them), and the job's default 540 s then ran out before
# both servers benched 32 requests a level
SPEED_DEADLINE_V33 = ("SERVED_DEADLINE_S", "900")

# The served runs' two forms. One GPU: the default and text recipes' jobs of both releases side
# by side in one served-all (ten small servers, each an explicit 4 GiB KV cache, then a `launcher
# bench` server where each DFlash one was; each may take up
# to SERVED_START_TIMEOUT_S to start, its cores shared by ten). Two or more: the same served-all
# with a GPU each in turn. Exact numerics, as the page's rows were measured (served.py: default
# numerics are not lossless at 8 and 22 in flight). Why one served-all: the page must fit a GPU
# host held for half an hour; with the default and the text jobs in turn, the one-GPU form added
# up to some 1,850 s on an H200 by their logs (the default jobs about 600 s).
ONE_GPU = (0, 1)
GPUS_2 = (2, 1 << 10)
SERVED_JOBS_BOTH = ("gemma4-moe-dflash:reference,dflash,stock,bench:exact "
                    "gemma4-moe-dflash-text:reference,dflash,bench:exact")
SIDE_BY_SIDE_START = ("SERVED_START_TIMEOUT_S", "900")
# The speed pair (served.md's speed rows, the measurement issue 51 judges) is a command of its own,
# make gpu-speed: one release at a time on one GPU (a speed job never shares its GPU: served_all.py
# refuses it), both at once on two. On a fresh H200 host 0.21.0's took 350 s and 0.33.0's 390 s.
# Regenerating the servers' rows (make gpu-served) then runs no speed comparison again.


def _speed_steps() -> tuple[Step, ...]:
    speed = ("SERVED_JOBS", "gemma4-moe-dflash:speed:default")
    return (
        _remote("served-all", OUT, speed, ("SERVED_VERSIONS", "0.21.0"), name="served-speed-0.21.0", gpus=ONE_GPU),
        _remote("served-all", OUT, speed, ("SERVED_VERSIONS", "0.33.0"), SPEED_DEADLINE_V33,
                name="served-speed-0.33.0", gpus=ONE_GPU),
        _remote("served-all", OUT, speed, ("SERVED_VERSIONS", "0.21.0 0.33.0"), ("SERVED_GPUS", "0,1"),
                SPEED_DEADLINE_V33, name="served-speed-paired", gpus=GPUS_2),
    )

STAGE_BUNDLE = _stage("stage-bundle")
STAGE_FA2 = _stage("stage-fa2", "--extras", "--extras-name", "extras-fa2")
STAGE_QUANT = _stage("stage-quant", "--extras", "--extras-name", "extras-quant", "--no-fa2", "--quant-wheels")
STAGE_V33 = _stage("stage-v33", "--vllm", "0.33.0", "--with-fa2")
STAGE_CORPUS = _stage("stage-corpus", "--corpus")
RECEIVE = _remote("receive")
OUT = ("OUT", "{work}/out")
# The trained target: restored from .stage/extras-trained when its parts were staged (checked
# against its record's target_sha256), otherwise the gated recipe (first stage, polish, drafter).
TRAIN_TARGET = _remote("train-target", ("OUT", "{work}/out/trained"))
TRAIN_DRAFTER = _remote("train-drafter", ("OUT", "{work}/out/trained"))
PREPARE = _remote("prepare")


def _merge_realshape(raw: str, meta: str, vllm: str, *extra: str) -> Step:
    return Step(f"merge-{raw}", "cpu",
                ("{py}", "tests/gpu/runs/realshape.py", "--merge-only", "--models", "{work}/no-models",
                 "--raw-dir", "{work}/" + raw, "--meta", "{work}/" + meta, "--vllm", vllm, *extra,
                 "--out", "{results}/realshape.json", "--md", "{results}/realshape.md"),
                writes=("realshape.json",))


MERGE_TRAINED = _merge_realshape("realshape-raw-trained", "rs-meta-trained.json", "0.21.0",
                                 "--nvfp4-walks", "{work}/lanes-out-walk")
MERGE_V33_TRAINED = _merge_realshape("realshape-raw-v33-trained", "rs-meta-v33-trained.json", "0.33.0",
                                     "--nvfp4-walks", "{work}/lanes-out-walk")
MERGE_SERVED = Step("merge-served", "cpu", ("{py}", "tests/gpu/reports/evidence.py", "merge-served",
                                            "{work}/out/served.json", "{results}", "--raw-from", "{work}"),
                    writes=("served.json",))
REJUDGE = Step("rejudge", "cpu", ("{py}", "tests/gpu/judging/rejudge.py", "--results", "{results}", "--out-dir", "{results}"),
               writes=("rejudge.json",))
ACCEPTANCE_REPORT = Step("acceptance-report", "cpu",
                         ("{py}", "tests/gpu/reports/acceptance_report.py", "--realshape", "{results}/realshape.json",
                          "--served", "{results}/served.json",
                          "--conformance", "{results}/" + CONFORMANCE_ARCHIVE, "--out-dir", "{results}"),
                         writes=("acceptance.json", "acceptance-headline.json"))
# The full-size archive of the H200 host predates gpu.txt inside it: the GPU line (nvidia-smi's
# name, memory and driver) that remote.sh wrote beside it is the one input replay writes in.
FULLSIZE_GPU = "NVIDIA H200, 143771 MiB, 580.159.04"
FULLSIZE_ARCHIVE = "fullsize-raw-2026-11-27-h200.tar.xz"
# The gated target 84c26c18 on a host of two H200s, two runs (out/multinode-*.json: TP 2 and two
# nodes; then both with the drafter, and TP 1). The earlier target 083e4869's three runs stay in
# multinode/served-raw-2026-11-29-h200x2.tar.xz, which no page reads.
MULTINODE_ARCHIVE = "multinode/84c26c18/served-raw-h200x2.tar.xz"
FULLSIZE_CHECKPOINTS = _remote("full-size-checkpoints", ("OUT", "{work}/out"), replay=(FULLSIZE_ARCHIVE,),
                               replay_files=(("fullsize-raw/gpu.txt", FULLSIZE_GPU + "\n"),))

PAGES: dict[str, tuple[Step, ...]] = {
    # realshape.md: the random-target rounds of both releases, then the trained-target rows.
    "realshape": (
        STAGE_BUNDLE, STAGE_FA2, STAGE_QUANT, STAGE_V33, RECEIVE,
        _remote("stability", OUT), _remote("quantize-rs"),
        _remote("realshape", OUT), _remote("realshape-v33", OUT),
        TRAIN_TARGET, TRAIN_DRAFTER,
        _remote("realshape-trained", OUT), _remote("realshape-v33-trained", OUT),
        Step("publish-realshape", "cpu", ("cp", "{work}/out/realshape.json", "{work}/out/realshape.md", "{results}/"),
             writes=("realshape.json",)),
        REJUDGE,
    ),
    # served.md: `launcher serve` servers of both releases and both recipes.
    "served": (
        STAGE_BUNDLE, STAGE_FA2, STAGE_V33, RECEIVE, TRAIN_TARGET, TRAIN_DRAFTER,
        _remote("served-all", OUT, ("SERVED_JOBS", SERVED_JOBS_BOTH), ("SERVED_DEADLINE_S", "3600"),
                SIDE_BY_SIDE_START, name="served-all", gpus=ONE_GPU),
        _remote("served-all", OUT, ("SERVED_JOBS", SERVED_JOBS_BOTH), ("SERVED_GPUS", "0,1"),
                ("SERVED_DEADLINE_S", "3600"), SIDE_BY_SIDE_START, name="served-all-paired", gpus=GPUS_2),
        MERGE_SERVED, REJUDGE,
    ),
    # served.md's speed rows: the speed pair of both releases on the gated target's prompts.
    "speed": (
        STAGE_BUNDLE, STAGE_FA2, STAGE_V33, RECEIVE, TRAIN_TARGET, TRAIN_DRAFTER,
        *_speed_steps(),
        MERGE_SERVED, REJUDGE,
    ),
    # acceptance.md: the drafter's rows as lanes of engines (plans/acceptance-rows-1gpu.sh), the
    # NVFP4 walks beside them, then both releases' merges and the report. Its served speed columns
    # are read from served.json, the served page's record (its speed pair runs there): so each page
    # fits a GPU host held for half an hour (twelve of the lanes took about 690 s on one H200, the
    # speed pair some 740 s on a fresh host), and regenerating this page runs no speed comparison again.
    "acceptance": (
        STAGE_BUNDLE, STAGE_FA2, STAGE_QUANT, STAGE_V33, RECEIVE, TRAIN_TARGET, TRAIN_DRAFTER, PREPARE,
        # lanes-wait fails for a lane that ended with an error; its records and logs are kept all the same
        Step("lanes", "gpu", ("bash", "-c", ". tests/gpu/plans/acceptance-rows-1gpu.sh && "
                                            "bash tests/gpu/remote.sh lanes-bg && { bash tests/gpu/remote.sh lanes-wait; "
                                            "rc=$?; bash tests/gpu/remote.sh archive-lanes; exit $rc; }"),
             env=(("WORK", "{work}"), OUT, ("RS_WALK_NVFP4", "1"), ("LANES_WAIT_S", "7200"))),
        MERGE_TRAINED, MERGE_V33_TRAINED, ACCEPTANCE_REPORT, REJUDGE,
    ),
    # fullsize.md: the full-size checkpoints, the bench at 1/4/16/22 and both profiles' fit runs.
    "fullsize": (
        STAGE_BUNDLE, STAGE_FA2, RECEIVE,
        FULLSIZE_CHECKPOINTS,
        _remote("full-bench", OUT, ("FIT_DRAFTER", "0"), name="full-bench-nodrafter"),
        _remote("full-bench", OUT, name="full-bench-dflash"),
        _remote("fit", OUT, name="fit-rtx5090"),
        _remote("fit", OUT, ("FIT_PROFILE", "dgx-spark"), name="fit-dgx-spark"),
        Step("fullsize-report", "cpu",
             ("{py}", "tests/gpu/reports/fullsize_report.py", "--shapes", "{work}/fullsize-raw/fullsize-shapes.json",
              "--runs", "{work}/fullsize-raw", "--attempts", "{work}/fullsize-raw/attempts",
              "--roofline", "{work}/fullsize-raw/roofline.json", "--bandwidth", "{work}/fullsize-raw/bandwidth.json",
              "--bench-json", "{results}/bench.json", "--gpu-file", "{work}/fullsize-raw/gpu.txt",
              "--acceptance", "{results}/acceptance.json",
              "--acceptance-run", "trained-dflash-trained-fa2-cg-bf16-capture", "--acceptance-drafter", "4f7c6c17",
              "--json", "{results}/fullsize.json", "--md", "{results}/fullsize.md"),
             writes=("fullsize.json",)),
    ),
    # conformance.md: a target that passes the gate and its drafter, z-lab's loop on them, the
    # served no-drafter twin and the served drafter, then the judgement.
    "conformance": (
        STAGE_BUNDLE, STAGE_FA2, STAGE_V33, STAGE_CORPUS, RECEIVE,
        # The first stage, its polish, the second polish "long" (84c26c18: choose-polish kept
        # "long-heavy", 9b666f25, whose references served by 0.21.0 loop in 4 of 36;
        # results/trained/target-2026-11-29/served-gate-2026-11-30.json), then the drafter.
        _remote("target-bg", ("POLISH", "1"), ("POLISH_AGAIN", "long"), ("CHAIN_DRAFTER", "1")),
        _remote("target-wait", OUT, ("TARGET_WAIT_S", "14400")),
        # The twins served once, in a work folder of their own, before the conformance run
        # serves them again: the target is fit only when both runs pass the gate on both
        # releases and give the same tokens (the served-gate step below).
        _remote("served-all", ("WORK", "{work}/twins-first"), ("OUT", "{work}/twins-first/out"),
                ("SERVED_JOBS", "gemma4-moe-dflash:conformance-twin:exact"), ("SERVED_VERSIONS", "0.21.0 0.33.0"),
                name="served-twins"),
        _remote("zlab-reference", OUT),
        # Exact numerics, one prompt at a time (issue 50, item 4); 0.21.0 also on its series less
        # the per-layer drafter attention (item 5). Each job serves its own no-drafter twin.
        _remote("served-all", OUT, ("SERVED_JOBS", "gemma4-moe-dflash:conformance-twin,conformance:exact"),
                ("SERVED_VERSIONS", f"0.21.0 0.33.0 0.21.0-without-{PER_LAYER}"),
                name="served-conformance", replay=(CONFORMANCE_ARCHIVE,)),
        Step("served-gate", "cpu",
             ("{py}", "tests/gpu/judging/served_gate.py", "--prefer", "target", "--out", "{results}/" + SERVED_GATE,
              "--twin", "target:0.21.0:1={work}/twins-first/served/conformance-twin.json",
              "--twin", "target:0.21.0:2={work}/served/conformance-twin.json",
              "--twin", "target:0.33.0:1={work}/twins-first/served-v33/conformance-twin.json",
              "--twin", "target:0.33.0:2={work}/served-v33/conformance-twin.json"),
             writes=(SERVED_GATE,)),
        Step("conformance-report", "cpu",
             ("{py}", "tests/gpu/judging/conformance.py", "--zlab", "{work}/out/zlab-reference.json",
              "--twin", "{work}/served/conformance-twin.json", "--served", "{work}/served/conformance.json",
              "--twin", "{work}/served-v33/conformance-twin.json", "--served", "{work}/served-v33/conformance.json",
              "--twin", f"{{work}}/served-0.21.0-without-{PER_LAYER}/conformance-twin.json",
              "--served", f"{{work}}/served-0.21.0-without-{PER_LAYER}/conformance.json",
              # the first run, judged by the count its bars file set (a miss): kept on the page
              "--earlier", "{results}/conformance/earlier-2026-11-29-first.json",
              # the second run on 083e4869, whose 0.33.0 twin failed the gate (4 of 36 looping)
              "--earlier", "{results}/conformance/earlier-083e4869-260cb5aa.json", "--out", "{results}"),
             writes=("conformance.json",)),
    ),
    # multinode.md (a host with two GPUs): the gated target, then two `launcher serve` nodes against
    # one process with TP 2 and with TP 1, with and without the drafter (multinode_served.py).
    "multinode": (
        STAGE_BUNDLE, STAGE_V33, STAGE_CORPUS, RECEIVE, TRAIN_TARGET,
        _remote("multinode-bg"),
        _remote("multinode-wait", OUT, ("MN_WAIT_S", "14400"), replay=(MULTINODE_ARCHIVE,)),
        # Every run in out/ is one record: a server that did not answer in one run is taken from
        # the run where it did (the same target, series and bars, or the merge refuses).
        Step("record-multinode", "cpu", ("{py}", "tests/gpu/runs/multinode_served.py", "--merge", "{work}/out",
                                        "--out", "{results}"), writes=("multinode.json",)),
    ),
    # speedup-curve.md: the frozen step-time model (committed before the curve), then the curve's
    # batches of 0.33.0 and the 0.21.0 spot check, each batch committing the record, then the report.
    "speedup": (
        STAGE_BUNDLE, STAGE_FA2, STAGE_V33, RECEIVE,
        FULLSIZE_CHECKPOINTS,
        _remote("speedup-frozen", OUT),
        _remote("speedup-curve", OUT, name="speedup-curve-0.33.0"),
        # the oracle's cost at K 15, concurrency 4, timed in turn with the real drafter
        _remote("speedup-oracle-cost", OUT),
        _remote("speedup-curve", OUT, ("SPEEDUP_VLLM", "0.21.0"), name="speedup-curve-0.21.0"),
        Step("speedup-report", "cpu",
             ("{py}", "tests/gpu/reports/speedup_report.py", "--curve", "{results}/speedup-curve.json",
              "--frozen", "{results}/speedup-frozen.json", "--md", "{results}/speedup-curve.md",
              "--png", "{results}/speedup-curve.png", "--table", "{table}"),
             writes=("speedup-curve.md",)),
    ),
}
# make gpu-evidence: every page, in an order where each report finds the pages it reads
# (acceptance reads served.json's speed rows, fullsize reads acceptance.json).
ORDER = ("realshape", "served", "speed", "acceptance", "fullsize", "conformance", "speedup", "multinode")


def sequence(pages: list[str], where: tuple[str, ...] = WHERE) -> list[Step]:
    """The pages' steps in order, each once, only those on the sides of the split named; a side
    never runs before the one before it. A staging or GPU step shared by pages runs where it first
    appears; a merge or report, where it last appears (rejudge after every merge)."""
    steps = [step for page in pages for step in PAGES[page]]
    once = [s for i, s in enumerate(steps) if (s not in steps[:i]) if s.where != "cpu"] + \
           [s for i, s in enumerate(steps) if s.where == "cpu" and s not in steps[i + 1:]]
    return [s for side in WHERE if side in where for s in once if s.where == side]


# The launcher's break-even table (launcher/bench/breakeven.py), which the speed-up report writes.
TABLE = REPO / "launcher" / "bench" / "breakeven.json"


def values(results: Path, work: Path, table: Path = TABLE) -> dict:
    return {"py": sys.executable, "results": str(results), "work": str(work), "table": str(table)}


def gpu_count() -> int:
    """The GPUs this host's runs see: EVIDENCE_GPUS where set; else CUDA_VISIBLE_DEVICES's list
    where set (a host of two GPUs limited to one runs the one-GPU form); else nvidia-smi's list
    (0 without it)."""
    if os.environ.get("EVIDENCE_GPUS"):
        return int(os.environ["EVIDENCE_GPUS"])
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip()])
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def run(pages: list[str], where: tuple[str, ...], results: Path = RESULTS, work: Path = WORK,
        gpus: int | None = None) -> int:
    vals = values(results, work)
    work.mkdir(parents=True, exist_ok=True)
    gpus = gpu_count() if gpus is None else gpus
    for step in sequence(pages, where):
        if not step.runs_on(gpus):
            print(f"[{step.name}] not on a host of {gpus} GPU(s): the other form runs", flush=True)
            continue
        print(f"[{step.name}] {' '.join(step.command(vals))}", flush=True)
        proc = subprocess.run(step.command(vals), cwd=REPO, env={**os.environ, **step.environ(vals)})
        if proc.returncode != 0:
            print(f"[{step.name}] exited {proc.returncode}", file=sys.stderr)
            return proc.returncode
    return 0


def merge_served(src: Path, results: Path, raw_from: Path | None = None) -> None:
    """The rows of a served.json a GPU host wrote into ``results/served.json`` (served.merge_rows:
    the same server, release and recipe replaced, new ones last), and served.md from it; the
    `launcher bench` files its rows name beside it (``served_bench_files``), and with ``raw_from``
    the run's raw records filed under ``results/served/`` (``archive_served_raw``)."""
    sys.path.insert(0, str(HERE))
    import gpu_paths  # noqa: E402,F401  (every folder of the harness on sys.path)
    import served
    import served_report

    mine = json.loads(src.read_text())
    dest = results / "served.json"
    before = json.loads(dest.read_text()) if dest.exists() else None
    lost = served.lost_rows((before or {}).get("servers", []), mine["servers"])
    if lost:
        raise SystemExit(f"merge-served: {src} has servers that did not start where {dest} has ones that "
                         f"did ({'; '.join(lost)}): nothing merged")
    served_bench_files(mine["servers"], src.parent, results)
    if raw_from is not None:
        archive_served_raw(raw_from, results / "served", mine.get("meta") or {})
    if before is not None:
        rows = served.merge_rows(served.stamp_models(before.get("servers", []), before.get("meta") or {}),
                                 served.stamp_models(mine["servers"], mine.get("meta") or {}))
        mine = {"meta": mine.get("meta") or before.get("meta"), "servers": rows}
    dest.write_text(json.dumps(mine, indent=1) + "\n")
    (results / "served.md").write_text(served_report.markdown(mine))


def served_bench_files(rows: list[dict], out: Path, results: Path) -> list[str]:
    """The `launcher bench` files the rows name (``bench``, ``baseline_bench``: results/NAME),
    copied from ``out`` or from the packs there (served_all.pack_out); a name found nowhere is
    refused, so no row points at an earlier run's file."""
    names = sorted({Path(r[k]).name for r in rows for k in ("bench", "baseline_bench") if r.get(k)})
    packs = sorted(out.glob("served-out*.tar.gz"))
    for name in names:
        if (out / name).is_file():
            shutil.copyfile(out / name, results / name)
            continue
        for pack in packs:
            with tarfile.open(pack) as tar:
                member = next((m for m in tar.getmembers() if Path(m.name).name == name and m.isfile()), None)
                if member is not None:
                    (results / name).write_bytes(tar.extractfile(member).read())
                    break
        else:
            raise SystemExit(f"merge-served: {name}, which a row names, is neither in {out} nor in its packs")
    return names


def archive_served_raw(work: Path, dest: Path, meta: dict) -> Path:
    """The run's raw phase records and logs (``work``'s served* folders, the served-all logs) as
    ``dest/served-raw-DATE-GPU-TARGET-DRAFTER.tar.xz``, where rejudge reads served phases."""
    import served_all  # on sys.path through merge_served
    gpu = (meta.get("gpu") or "gpu").split(",")[0].removeprefix("NVIDIA ").strip().lower().replace(" ", "-")
    name = "-".join(["served-raw", (meta.get("date") or "undated")[:10], gpu,
                     (meta.get("target_sha256") or "none")[:8], (meta.get("drafter_sha256") or "none")[:8]])
    dest.mkdir(parents=True, exist_ok=True)
    path = served_all.unused_path(dest, name, ".tar.xz")
    with tarfile.open(path, "w:xz") as tar:
        for entry in sorted([*work.glob("served*"), *(work / "out").glob("served-all-logs*.tar.gz")]):
            if entry.is_dir() or entry.suffix == ".gz":
                tar.add(entry, arcname=entry.name)
    return path


# Pages replay takes from the committed tree as they are, because no committed raw input makes them.
# Each: why. A results/*.json that is neither replayed nor listed here fails the replay test.
NOT_REPLAYED = {
    "realshape.json": "an accumulation of merges since the first random-target round: the records that "
                      "rejudge.py finds no raw record for (rejudge.json: records less judged_from_raw_tokens) "
                      "ran before raw records were kept; the trained-target records were amended in place by "
                      "walk_along.py --write, which reads the trained checkpoints (not committed); and most "
                      "archives hold no merge meta (date, GPU, command) that the records carry",
    "served.json": "each row was stamped with the meta of the call that wrote it (drafter hash, date, GPU, "
                   "command), which the served archives do not hold, and the reference and stock rows of both "
                   "releases were judged from phase records of which only the last call's are archived",
    "results.json": "results.md's start-up rounds (run_modes.py) kept no raw records",
    "bench.json": "bench_steps.py's run-*.json records were not committed; bench_report.py re-renders bench.md "
                  "from bench.json alone",
    "bench-series-dfaef318.json": "the step-time benchmark on series dfaef318: its run records were not committed",
    "diag-t12-unscaled-allexperts.json": "a diagnostic round of run_modes.py whose raw records were not committed",
    "diag-t12-unscaled-top2.json": "a diagnostic round of run_modes.py whose raw records were not committed",
    "abi-vllm-0.33.0-torch-2.11.0.json": "abi_check.py reads the installed vLLM 0.33.0 tree on the GPU host, "
                                         "which is not committed",
}
# Raw records committed as they came from the GPU host (`launcher bench` output files that served.json
# names; the speed-up curve's frozen model, curve, oracle-cost record and the oracle's overhead benchmark,
# which its runs write): inputs, not pages.
RAW_RECORDS = ("served-bench-", "speedup-frozen", "speedup-curve", "speedup-oracle-cost", "speedup-oracle-overhead")


def replay(pages: list[str], results: Path, work: Path, committed: Path = RESULTS) -> list[str]:
    """Run the pages' sequence with every GPU step replaced by unpacking its committed raw
    archives into ``work`` and every merge and report run for real, writing into ``results``.
    The pages in NOT_REPLAYED are copied from ``committed`` first (inputs), and the steps that
    write them, or only pages that have no committed record yet, are not run. Returns the names
    of the steps run."""
    results.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    for name in NOT_REPLAYED:
        for suffix in (".json", ".md"):
            src = committed / name.replace(".json", suffix)
            if src.exists():
                shutil.copyfile(src, results / src.name)
    # Raw records and folders the reports read beside the pages (the log archives, trained records)
    for entry in committed.iterdir():
        if entry.is_dir() and not (results / entry.name).exists():
            (results / entry.name).symlink_to(entry)
        elif entry.name.startswith(RAW_RECORDS):
            shutil.copyfile(entry, results / entry.name)
    vals, ran = values(results, work, work / "breakeven.json"), []
    for step in sequence(pages, ("gpu", "cpu")):
        if step.where == "gpu":
            for archive in step.replay:
                with tarfile.open(committed / archive) as tar:
                    tar.extractall(work, filter="data")
            for rel, text in step.replay_files:
                (work / rel).write_text(text)
            continue
        if set(step.writes) & NOT_REPLAYED.keys():
            continue
        if step.writes and not any((committed / w).exists() for w in step.writes):
            continue  # a page with no committed record yet (conformance.md): nothing to replay it from
        proc = subprocess.run(step.command(vals), cwd=REPO, env={**os.environ, **step.environ(vals)},
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{step.name} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
        ran.append(step.name)
    return ran


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    for cmd in ("run", "plan"):
        p = sub.add_parser(cmd)
        p.add_argument("pages", nargs="+", choices=[*PAGES, "all"])
        p.add_argument("--where", default=",".join(WHERE),
                       help="the sides of the split to run: network (staging), gpu, cpu (merges, reports)")
        p.add_argument("--results", type=Path, default=RESULTS)
        p.add_argument("--work", type=Path, default=WORK)
    p = sub.add_parser("merge-served")
    p.add_argument("src", type=Path)
    p.add_argument("results", type=Path)
    p.add_argument("--raw-from", type=Path, help="the GPU host's work folder: its raw served records archived")
    args = parser.parse_args(argv)
    if args.cmd == "merge-served":
        merge_served(args.src, args.results, args.raw_from)
        return 0
    pages = list(ORDER) if "all" in args.pages else args.pages
    where = tuple(w for w in args.where.split(",") if w)
    unknown = set(where) - set(WHERE)
    if unknown:
        parser.error(f"--where: unknown side(s) {sorted(unknown)}; the sides are {', '.join(WHERE)}")
    if args.cmd == "plan":
        vals = values(args.results, args.work)
        for step in sequence(pages, where):
            env = " ".join(f"{k}={v}" for k, v in step.environ(vals).items())
            host = {ONE_GPU: "[1 GPU] ", GPUS_2: "[2+ GPUs] "}.get(step.gpus, "")
            print(f"{step.where:8} {step.name:24} {host}{env + ' ' if env else ''}{' '.join(step.command(vals))}")
        return 0
    return run(pages, where, args.results, args.work)


if __name__ == "__main__":
    sys.exit(main())
