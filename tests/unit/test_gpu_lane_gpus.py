"""RS_LANE_GPUS: on a machine of several GPUs, realshape's lanes each take a GPU round-robin, and a
speed run may then run in a lane that has its GPU to itself. Runs remote.sh's own trained_lanes and
lanes_background, and realshape.py's own lane check and lanes (--run-lanes); the runs themselves (vLLM on a GPU, which
cannot exist here) are a stand-in realshape.py that writes down the GPU and runs it was given."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "tests" / "gpu"
sys.path.insert(0, str(GPU))
import realshape as rs  # noqa: E402

SPEED = next(n for n, r in rs.RUNS.items() if r.speed and r.trained and r.vllm == "0.21.0")
OTHER = "trained-ref-bf16"
# Three runs of 0.21.0 that are neither speed nor oracle runs (the lane check names unknown ones).
A, B, C = "trained-ref-bf16", "trained-ref-nvfp4", "trained-dflash-trained-fa2-cg-bf16"

# The stand-in: the lane check is realshape.py's own; a run notes CUDA_VISIBLE_DEVICES and --runs.
STAND_IN = f'''import os, sys
sys.path.insert(0, {str(GPU)!r})
import gpu_paths
import realshape
if "--run-lanes" in sys.argv:  # realshape.py's own lanes, each this stand-in
    sys.exit(realshape.main(sys.argv[1:]))
if "--check-lanes" in sys.argv or "--merge-only" in sys.argv:
    sys.exit(realshape.main(sys.argv[1:]) if "--check-lanes" in sys.argv else 0)
runs = sys.argv[sys.argv.index("--runs") + 1]
with open(os.path.join(os.environ["WORK"], "placed.txt"), "a") as f:
    f.write(f"{{runs}} gpu={{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}}\\n")
'''


def _lanes(tmp_path: Path, parallel: str, stand_in: str = STAND_IN, **env_extra) -> subprocess.CompletedProcess:
    tree = tmp_path / "tree"
    (tree / "tests" / "gpu" / "runs").mkdir(parents=True, exist_ok=True)
    (tree / "tests" / "gpu" / "runs" / "realshape.py").write_text(stand_in)
    functions = (GPU / "remote.sh").read_text().split("\ncmd=${1:-}\n")[0]
    (tmp_path / "f.sh").write_text(functions + '\ntrained_lanes 0.21.0 raw meta.json\n')
    env = dict(os.environ, WORK=str(tmp_path / "work"), OUT=str(tmp_path / "out"), PY=sys.executable,
               MODELS_TRAINED=str(tmp_path / "models"), RS_PARALLEL=parallel, RS_LANE_STAGGER_S="0",
               **env_extra)
    (tmp_path / "work").mkdir(exist_ok=True)
    (tmp_path / "out").mkdir(exist_ok=True)
    return subprocess.run(["bash", str(tmp_path / "f.sh")], cwd=tree, env=env, capture_output=True,
                          text=True, timeout=120)


def test_lanes_take_the_named_gpus_round_robin(tmp_path):
    done = _lanes(tmp_path, f"{A};{B};{C}", RS_LANE_GPUS="2,3")
    assert done.returncode == 0, done.stdout + done.stderr
    placed = sorted((tmp_path / "work" / "placed.txt").read_text().split("\n")[:-1])
    assert placed == sorted([f"{A} gpu=2", f"{B} gpu=3", f"{C} gpu=2"])


def test_without_named_gpus_the_lanes_see_every_gpu_as_before(tmp_path):
    done = _lanes(tmp_path, f"{A};{B}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted((tmp_path / "work" / "placed.txt").read_text().split("\n")[:-1]) == \
        sorted([f"{A} gpu=unset", f"{B} gpu=unset"])


def test_a_misspelt_run_or_one_of_the_other_release_starts_no_lane(tmp_path):
    done = _lanes(tmp_path, f"{A};{B}x;v33-trained-ref-bf16")
    assert done.returncode != 0
    assert f"{B}x: no such run" in done.stdout and "v33-trained-ref-bf16: a vLLM 0.33.0 run in the 0.21.0 lanes" in done.stdout
    assert not (tmp_path / "work" / "placed.txt").exists()


def test_a_speed_run_in_a_lane_of_its_own_gpu_runs_and_on_a_shared_gpu_is_refused(tmp_path):
    ok = _lanes(tmp_path, f"{SPEED};{OTHER}", RS_LANE_GPUS="0,1")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert f"{SPEED} gpu=0" in (tmp_path / "work" / "placed.txt").read_text()
    (tmp_path / "work" / "placed.txt").unlink()
    # Three lanes on two GPUs: the speed run's GPU 0 is the third lane's too.
    shared = _lanes(tmp_path, f"{SPEED};{OTHER};{B}", RS_LANE_GPUS="0,1")
    assert shared.returncode != 0 and f"{SPEED}: a speed run needs the GPU to itself" in shared.stdout
    assert not (tmp_path / "work" / "placed.txt").exists()


@pytest.mark.parametrize("gpus, refused", [({"RS_LANE_GPUS_21": "0,1", "RS_LANE_GPUS_33": "1,2"}, "share GPU 1"),
                                           ({"RS_LANE_GPUS_21": "0,1"}, "name both or neither")])
def test_both_releases_lanes_get_disjoint_gpus_or_nothing_starts(tmp_path, gpus, refused):
    functions = (GPU / "remote.sh").read_text().split("\ncmd=${1:-}\n")[0]
    (tmp_path / "f.sh").write_text(functions + '\nlanes_background\n')
    (tmp_path / "repo").mkdir()
    env = dict(os.environ, WORK=str(tmp_path / "work"), OUT=str(tmp_path / "out"), LANES_STAGGER_S="0",
               RS_PARALLEL_21="a", RS_PARALLEL_33="b", **gpus)
    done = subprocess.run(["bash", str(tmp_path / "f.sh")], cwd=tmp_path / "repo", env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode != 0 and refused in done.stderr
    assert not (tmp_path / "work" / "lanes-21.log").exists()


def test_lane_gpus_places_round_robin_and_none_without_names():
    assert rs.lane_gpus(3, ["0", "1"]) == ["0", "1", "0"]
    assert rs.lane_gpus(2, None) == [None, None]


def test_lanes_bg_refuses_a_misspelt_run_before_anything_starts(tmp_path):
    """lanes-bg checks both releases' lanes itself (the verbs would, minutes later, in a log)."""
    functions = (GPU / "remote.sh").read_text().split("\ncmd=${1:-}\n")[0]
    (tmp_path / "f.sh").write_text(functions + '\nsnapshot_tree() { mkdir -p "$1"; }\nlanes_background\n')
    # the NVFP4 copy the NVFP4 run of 0.21.0's lanes reads (extras-trained), a stand-in folder
    (tmp_path / "models" / "trained-a4b-r30-nvfp4").mkdir(parents=True)
    (tmp_path / "models" / "trained-a4b-r30-nvfp4" / "hf_quant_config.json").write_text("{}")
    env = dict(os.environ, WORK=str(tmp_path / "work"), OUT=str(tmp_path / "out"), LANES_STAGGER_S="0",
               PY=sys.executable, MODELS_TRAINED=str(tmp_path / "models"), STAGE=str(tmp_path / "stage"),
               RS_PARALLEL_21=f"{A};{B}", RS_PARALLEL_33="v33-trained-ref-bf16;v33-trained-ref-bf16-bi-noinductr")
    done = subprocess.run(["bash", str(tmp_path / "f.sh")], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode != 0
    assert "RS_PARALLEL_33: v33-trained-ref-bf16-bi-noinductr: no such run" in done.stderr
    assert not (tmp_path / "work" / "lanes-21.log").exists() and not (tmp_path / "work" / "lanes-33.log").exists()


def test_the_walk_along_each_runs_output_comes_after_the_lanes_and_before_the_merge(tmp_path):
    """trained_lanes walks the reference along every DFlash run's own text (walk_along.py --write,
    on the GPU) once the lanes have ended, then merges: the records carry it. Stand-ins note the
    order; the lane check is realshape.py's own."""
    tree = tmp_path / "tree" / "tests" / "gpu"
    tree.mkdir(parents=True)
    note = 'open(os.path.join(os.environ["WORK"], "order.txt"), "a").write({} + "\\n")'
    merging = STAND_IN.replace(
        'sys.exit(realshape.main(sys.argv[1:]) if "--check-lanes" in sys.argv else 0)',
        f'sys.exit(realshape.main(sys.argv[1:])) if "--check-lanes" in sys.argv else '
        f'({note.format(repr("merge"))}, sys.exit(0))')
    assert merging != STAND_IN
    walk_note = note.format('"walk " + " ".join(sys.argv[1:])')
    (tree / "runs").mkdir(parents=True, exist_ok=True)
    (tree / "runs" / "walk_along.py").write_text(f"import os, sys\n{walk_note}\nprint('walked along')\n")
    done = _lanes(tmp_path, f"{A};{B}", merging)
    assert done.returncode == 0, done.stdout + done.stderr
    order = (tmp_path / "work" / "order.txt").read_text().split("\n")[:-1]
    assert [line.split()[0] for line in order] == ["walk", "merge"]
    assert f"--raw {tmp_path / 'work' / 'raw'} --device cuda --write" in order[0]
    assert (tmp_path / "work" / "placed.txt").read_text().count("gpu=") == 2  # the lanes ran first
    # The walk's log is kept with the raw records: the logs tarball of the verb holds it.
    assert (tmp_path / "work" / "raw" / "walk-along.log").read_text() == "walked along\n"


def test_a_lane_process_is_this_script_with_its_runs_its_gpu_and_the_shared_options(tmp_path):
    raw = tmp_path / "work" / "realshape-raw-trained"
    argv = ["--models", "/m", "--raw-dir", str(raw), "--vllm", "0.21.0", "--deadline-s", "900",
            "--run-lanes", f"{A};{B},{C}", "--lane-gpus=0,1", "--lane-stagger-s", "5", "--site-stock", "/s"]
    jobs = rs.lane_jobs(argv, f"{A};{B},{C}", raw, ["0", "1"], environ={"RS_KV_CACHE_GIB": "9"},
                        script=Path("/x/realshape.py"))
    shared = ["--models", "/m", "--raw-dir", str(raw), "--vllm", "0.21.0", "--deadline-s", "900", "--site-stock", "/s"]
    assert [j.argv for j in jobs] == [[sys.executable, "/x/realshape.py", *shared, "--runs", lane] for lane in (A, f"{B},{C}")]
    assert [j.log for j in jobs] == [tmp_path / "work" / f"realshape-raw-trained-lane-{i}.log" for i in range(2)]
    assert [j.env for j in jobs] == [{"RS_GPU_UTIL": "0.25", "RS_KV_CACHE_GIB": "9", "CUDA_VISIBLE_DEVICES": g}
                                     for g in ("0", "1")]
    assert "CUDA_VISIBLE_DEVICES" not in rs.lane_jobs(argv, A, raw, None)[0].env


def test_a_failed_lane_does_not_stop_the_others_and_each_logs_apart(tmp_path):
    fails = STAND_IN.replace("runs = sys.argv", "sys.exit(4) if sys.argv[sys.argv.index('--runs') + 1] == "
                             f"{A!r} else None\nruns = sys.argv")
    assert fails != STAND_IN
    done = _lanes(tmp_path, f"{A};{B}", fails, RS_LANE_GPUS="0,1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "work" / "placed.txt").read_text() == f"{B} gpu=1\n"
    assert "raw-lane-0.log rc 4" in done.stdout and "raw-lane-1.log rc 0" in done.stdout
    assert (tmp_path / "work" / "raw-lane-0.log").is_file() and (tmp_path / "work" / "raw-lane-1.log").is_file()
