"""The served step timer (issue 25, item 5): bench_steps.StepTimer on both of vLLM's model
runners, its streaming mode, the vLLM plugin that attaches it inside `vllm serve`, and the
projection served.py builds from what it recorded.

No GPU here: CUDA events are replaced by a clock that advances a fixed time per event, and
the runners are stand-ins with the methods the released runners have (0.21.0's V1
``GPUModelRunner``, 0.33.0's V2 one in ``vllm/v1/worker/gpu``), checked against the released
sources below so a rename there fails here.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import sys
import types

import pytest

from tests.integration.patch_trees import pristine
from tests.unit.gpu_scripts import GPU_DIR, load

torch = pytest.importorskip("torch", reason="StepTimer records torch.cuda events (the test venv has torch)")
bench_steps = load("bench_steps")
sp = load("speed")
served = load("served")


class Event:
    """A CUDA event on a clock that advances 1 ms per record; ``done`` says whether the
    device has reached it (query())."""
    clock = [0.0]
    done = True

    def __init__(self, enable_timing=True):
        self.t = None

    def record(self):
        Event.clock[0] += 1.0
        self.t = Event.clock[0]

    def query(self):
        return Event.done

    def elapsed_time(self, other):
        return other.t - self.t


@pytest.fixture(autouse=True)
def fake_events(monkeypatch):
    Event.clock, Event.done = [0.0], True
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)


class V2Runner:
    """0.33.0's V2 runner: no _model_forward, a speculator with propose."""

    def __init__(self):
        self.model = types.SimpleNamespace(compute_logits=lambda h: h)
        self.speculator = types.SimpleNamespace(propose=lambda: None)

    def execute_model(self, scheduler_output, intermediate_tensors=None):
        return None

    def sample_tokens(self, grammar_output=None):
        return None


def _step(runner, tokens: int):
    runner.execute_model(types.SimpleNamespace(total_num_scheduled_tokens=tokens))
    runner.speculator.propose()
    runner.sample_tokens(None)


def test_on_the_v2_runner_a_step_counts_the_scheduled_tokens_and_times_the_speculator():
    runner = V2Runner()
    timer = bench_steps.StepTimer(torch, runner)
    timer.active = True
    for _ in range(3):
        _step(runner, 16)
    steps = timer.collect()
    assert [s["forward_tokens"] for s in steps] == [16, 16, 16]
    # events: start, propose start/end, end: the step spans 3 ms, propose 1 ms
    assert all(s["step_ms"] == 3.0 and s["propose_ms"] == 1.0 and "forward_ms" not in s for s in steps)


def test_streaming_hands_over_only_steps_the_device_has_finished_and_keeps_the_newest():
    runner, got = V2Runner(), []
    timer = bench_steps.StepTimer(torch, runner, sink=got.extend)
    timer.active = True
    Event.done = False  # the device is behind: nothing may be resolved yet
    for _ in range(timer.FLUSH_EVERY + 2):
        _step(runner, 1)
    assert got == [] and len(timer.steps) == timer.FLUSH_EVERY + 2
    Event.done = True
    _step(runner, 1)  # its start flushes every finished step but the newest
    assert len(got) == timer.FLUSH_EVERY + 1 and len(timer.steps) == 2
    assert all(s["forward_tokens"] == 1 and isinstance(s["t"], float) for s in got)


def test_the_plugin_times_the_runner_it_finds_once_the_model_is_loaded(tmp_path, monkeypatch):
    """vllm_step_times.register on a stand-in runner module (mocked: the released runner
    modules need vLLM's compiled extension, absent here)."""
    plugin_dir = GPU_DIR / "step_times"
    monkeypatch.syspath_prepend(str(plugin_dir))
    # the dist-info beside the module is what makes vLLM find it (entry point group)
    eps = [e for e in importlib.metadata.entry_points(group="vllm.general_plugins") if e.name == "step_times"]
    assert [e.value for e in eps] == ["vllm_step_times:register"]
    plugin = eps[0].load().__module__
    mod = sys.modules[plugin]

    class Runner(V2Runner):
        def load_model(self):
            self.loaded = True

    fake = types.ModuleType("vllm.v1.worker.gpu.model_runner")
    fake.GPUModelRunner = Runner
    monkeypatch.setitem(sys.modules, "vllm.v1.worker.gpu.model_runner", fake)
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    out = tmp_path / "steps.jsonl"
    monkeypatch.delenv(mod.ENV, raising=False)
    mod.register()
    assert not getattr(Runner.load_model, "_step_times", False)  # without the variable: nothing
    monkeypatch.setenv(mod.ENV, str(out))
    mod.register()
    mod.register()  # vLLM loads plugins in every process, maybe more than once: one wrap
    assert sum(type(f).__name__ == "_RunnerFinder" for f in sys.meta_path) == 1
    runner = Runner()
    runner.load_model()
    assert runner.loaded and runner._step_timer.sink is not None
    for _ in range(bench_steps.StepTimer.FLUSH_EVERY + 3):
        _step(runner, 16)
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    # the 34th step's start found 33 queued and wrote all but the newest
    assert len(lines) == bench_steps.StepTimer.FLUSH_EVERY and lines[0]["forward_tokens"] == 16


def test_a_runner_module_imported_later_is_wrapped_when_it_runs(tmp_path, monkeypatch):
    """The API server loads plugins too and must not import the runner (CUDA, then a fork):
    the finder wraps the module when the worker imports it. A stand-in module file under a
    runner's name (mocked: the released runner needs vLLM's compiled extension)."""
    monkeypatch.syspath_prepend(str(GPU_DIR / "step_times"))
    mod = __import__("vllm_step_times")
    pkg = tmp_path / "pkgs"
    (pkg / "fakevllm").mkdir(parents=True)
    (pkg / "fakevllm" / "__init__.py").write_text("")
    (pkg / "fakevllm" / "runner.py").write_text(
        "class GPUModelRunner:\n    def load_model(self):\n        self.loaded = True\n")
    monkeypatch.syspath_prepend(str(pkg))
    monkeypatch.setattr(mod, "RUNNERS", ("fakevllm.runner",))
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.setenv(mod.ENV, str(tmp_path / "s.jsonl"))
    mod.register()
    assert "fakevllm.runner" not in sys.modules  # nothing imported by the plugin itself
    import fakevllm.runner
    assert fakevllm.runner.GPUModelRunner.load_model._step_times is True
    monkeypatch.delitem(sys.modules, "fakevllm.runner")
    monkeypatch.delitem(sys.modules, "fakevllm")


def test_the_released_runners_have_what_the_timer_wraps():
    """The released wheels' runner sources (PyPI, cached under ~/.cache)."""
    v21 = (pristine("0.21.0", "site-packages") / "vllm/v1/worker/gpu_model_runner.py").read_text()
    v33 = (pristine("0.33.0", "site-packages") / "vllm/v1/worker/gpu/model_runner.py").read_text()
    for src in (v21, v33):
        for name in ("load_model", "execute_model", "sample_tokens"):
            assert re.search(rf"\n    def {name}\(", src), name
    assert "def _model_forward(" in v21 and "self.drafter" in v21
    assert "def _model_forward(" not in v33 and "self.speculator" in v33


def _steps(tokens: int, step: float, propose: float | None, n: int) -> list[dict]:
    return [{"forward_tokens": tokens, "step_ms": step, **({"propose_ms": propose} if propose else {})}
            for _ in range(n)]


def test_the_served_projection_uses_each_levels_steady_steps():
    comparison = [{"concurrency": 1, "output_tok_s": {"with_drafter": 430.0, "without": 270.0}, "speedup": 430 / 270,
                   "tpot_ms_mean": {"with_drafter": 2.0, "without": 2.6}, "mean_acceptance_length": 3.2}]
    # DFlash: 16-token verify steps of 6 ms, 1.5 of them propose; alone: 1-token steps of 2.5 ms;
    # other levels' steps (64 and 4 tokens) must not count
    dflash = _steps(16, 6.0, 1.5, 40) + _steps(64, 20.0, 3.0, 40)
    alone = _steps(1, 2.5, None, 40) + _steps(4, 9.0, None, 40)
    one = sp.served_pair(comparison, dflash, alone, 15)["1"]
    assert (one["t_decode_ms"], one["t_verify_ms"], one["t_draft_ms"]) == (2.5, 4.5, 1.5)
    assert one["projected_speedup"] == round(3.2 * 2.5 / 6.0, 4)
    assert one["measured_speedup"] == round(430 / 270, 4) and one["measured_tpot_speedup"] == 1.3
    assert one["measured_over_projected"] == round(round(430 / 270, 4) / one["projected_speedup"], 4)


def test_the_speed_phase_times_both_servers_and_projects_from_their_steps(tmp_path):
    argv = ["python", "-m", "vllm", "serve", "m", "--speculative-config",
            json.dumps({"method": "dflash", "num_speculative_tokens": 15})]
    assert served.spec_tokens(argv) == 15 and served.spec_tokens(["serve"]) is None
    env = served.launcher_env("/site", tmp_path / "s.jsonl")
    assert env[served.STEP_TIMES_ENV] == str(tmp_path / "s.jsonl")
    assert env["PYTHONPATH"].split(":")[-1] == str(served.STEP_TIMES_PLUGIN)
    assert served.STEP_TIMES_ENV not in served.launcher_env("/site")

    class Ph:
        def __init__(self, name, record, steps):
            self.name, self.record, self.step_times = name, record, tmp_path / f"{name}.jsonl"
            self.step_times.write_text("".join(json.dumps(s) + "\n" for s in steps))

    comparison = [{"concurrency": 1, "output_tok_s": {"with_drafter": 400.0, "without": 300.0}, "speedup": 4 / 3,
                   "tpot_ms_mean": {}, "mean_acceptance_length": 3.0}]
    dfl = Ph("speed-dflash", {"server": "speed-dflash", "argv": argv, "bench_comparison": comparison},
             _steps(16, 6.0, 1.0, 10))
    base = Ph("speed-reference", {}, _steps(1, 2.5, None, 10))
    with base.step_times.open("a") as f:
        f.write('{"forward_tokens": 1, "step_')  # cut by the server's stop
    served.project_speed(dfl, base)
    assert dfl.record["step_counts"] == {"speed-dflash": 10, "speed-reference": 10}
    assert dfl.record["speed_projection"]["1"]["projected_speedup"] == 1.25
    row = served.report.speed_row(dfl.record, base.record)
    assert row["speed"][0]["projected_speedup"] == 1.25 and row["speed"][0]["t_verify_ms"] == 5.0


def test_the_host_period_counts_only_back_to_back_steady_steps():
    # 16-token steps every 8 ms (a gap of 1 s between two requests), 64-token ones between them
    t, steps = 100.0, []
    for i in range(10):
        steps.append({"forward_tokens": 16, "step_ms": 6.0, "t": t})
        t += 0.008 if i != 4 else 1.0
    steps += [{"forward_tokens": 64, "step_ms": 9.0, "t": t + 0.005 * i} for i in range(5)]
    assert sp.step_period_ms(steps, 16) == 8.0
    assert sp.step_period_ms(steps, 64) == 5.0
    assert sp.step_period_ms(steps, 32) is None
    comparison = [{"concurrency": 1, "output_tok_s": {}, "speedup": None, "tpot_ms_mean": {},
                   "mean_acceptance_length": 3.0}]
    alone = [{"forward_tokens": 1, "step_ms": 2.0, "t": 200 + 0.004 * i} for i in range(10)]
    one = sp.served_pair(comparison, steps, alone, 15)["1"]
    assert (one["dflash_period_ms"], one["decode_period_ms"]) == (8.0, 4.0)
    assert one["projected_speedup_by_period"] == 1.5
