"""``launcher bench``: a recipe's workloads against a running server, one result document.

For every run (workload x concurrency): scrape ``/metrics``, send the load
(``vllm bench serve`` or the built-in client), scrape again; the difference
of the speculative-decoding counters gives the acceptance of that run alone.
"""

from __future__ import annotations

import json
import re
import time
import uuid
import urllib.error
import urllib.request
from collections.abc import Callable

from launcher import progress
from launcher.bench import client, metrics, vllm_bench, workload
from launcher.bench.client import Target
from launcher.errors import LauncherError
from launcher.recipe import Recipe

Echo = Callable[[str], None]


def server_models(base_url: str, api_key: str | None, timeout: float = 10.0) -> list[str]:
    req = urllib.request.Request(f"{base_url}/v1/models")
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            data = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        hint = None
        if exc.code == 401:
            hint = ("the server refused the key given (--api-key or VLLM_API_KEY): pass the one it was started with"
                    if api_key else "pass --api-key (or set VLLM_API_KEY)")
        raise LauncherError(f"{base_url}/v1/models answered HTTP {exc.code}", hint=hint) from None
    except (OSError, ValueError) as exc:
        raise LauncherError(f"no OpenAI-compatible server answers at {base_url} ({exc})",
                            hint="start one (launcher serve --recipe NAME) or pass --url") from None
    listed = data.get("data") if isinstance(data, dict) else None
    if not isinstance(listed, list):
        raise LauncherError(f"{base_url}/v1/models answered {json.dumps(data)[:120]}, not an OpenAI model list",
                            hint="is --url an OpenAI-compatible server (vllm serve)?")
    return [m["id"] for m in listed if isinstance(m, dict) and isinstance(m.get("id"), str) and m["id"]]


def server_version(base_url: str, api_key: str | None, timeout: float = 5.0) -> str | None:
    """The vLLM release a server reports at ``/version``; None where it does not say."""
    req = urllib.request.Request(f"{base_url}/version")
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            version = json.loads(resp.read()).get("version")
    except (OSError, ValueError, AttributeError):
        return None
    return version if isinstance(version, str) and version else None


def choose_model(rec: Recipe, served: list[str], wanted: str | None) -> str:
    if wanted:
        if wanted not in served:
            raise LauncherError(f"the server does not serve {wanted!r}", hint=f"it serves: {', '.join(served) or 'nothing'}")
        return wanted
    for name in rec.target.served_names:
        if name in served:
            return name
    if not served:
        raise LauncherError("the server lists no model at /v1/models")
    if rec.target.served_names:
        # another recipe's server: its numbers would be filed under this recipe's name
        raise LauncherError(f"the server serves {', '.join(served)}, none of recipe {rec.name}'s names "
                            f"({', '.join(rec.target.served_names)})",
                            hint="pass the --recipe that server runs, or --model NAME to measure it anyway")
    return served[0]


def pick_client(choice: str) -> str:
    if choice not in ("auto", "vllm", "builtin"):
        raise LauncherError(f"--client {choice!r}: expected auto, vllm or builtin")
    if choice == "vllm" and not vllm_bench.available():
        raise LauncherError("--client vllm: no `vllm` command on PATH", hint="install vLLM, or use --client builtin")
    if choice == "auto":
        return "vllm" if vllm_bench.available() else "builtin"
    return choice


def bench(rec: Recipe, *, base_url: str, model: str | None, api_key: str | None, profile: str | None,
          only: list[str] | None, client_choice: str, tokenizer: str | None, timeout: float, echo: Echo,
          on_run: Callable[[dict], None] | None = None, vocab_size: int | None = None,
          levels: list[int | str] | None = None, min_requests: int | None = None,
          prompts_source: list | None = None, output_len: int | None = None, record_outputs: bool = False,
          prompt_set: dict | None = None) -> dict:
    """Every run of the recipe's workloads (at ``levels`` where given, else at each workload's
    own concurrency list); ``on_run`` gets the document after each run (partial results).
    ``prompts_source``: the prompt set instead of the bundled one; ``output_len``: every
    workload's; ``record_outputs``: each run keeps its requests' token ids (built-in client);
    ``prompt_set``: the prompt file's identity, in the document from its first save on (a
    partial result is still compared only against a baseline of the same prompts)."""
    base_url = base_url.rstrip("/")
    runs = workload.runs(rec, profile=profile, only=only, levels=levels, min_requests=min_requests,
                         output_len=output_len)
    kind = pick_client(client_choice)
    served = server_models(base_url, api_key)
    target = Target(base_url, choose_model(rec, served, model), api_key)
    profile_name = workload.profile_of(rec, profile)
    spec_before = metrics.scrape(base_url)
    doc = {
        "recipe": rec.name,
        "url": base_url,
        "model": target.model,
        "client": "vllm bench serve" if kind == "vllm" else "built-in",
        "profile": profile_name,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "speculative_decoding": spec_before is not None,
        "num_speculative_tokens": rec.drafter.num_speculative_tokens if rec.drafter else None,
        "server_vllm": server_version(base_url, api_key),
        "random_token_band": list(workload.token_band(vocab_size)),
        "sampling": {"temperature": rec.bench.temperature, "seed": rec.bench.seed, "ignore_eos": rec.bench.ignore_eos},
        "warm_up": f"one unmeasured round per level: its concurrency in requests of {WARM_UP_TOKENS} tokens",
        **({"prompts_file": prompt_set} if prompt_set is not None else {}),
        "runs": [],
    }
    echo(f"bench {rec.name} -> {base_url} model {target.model} ({doc['client']}, profile {profile_name}, "
         f"speculative decoding {'on' if spec_before is not None else 'off'})")
    _warm_up(target, rec, timeout)
    for i, run in enumerate(runs, 1):
        _warm_level(target, run, rec, vocab_size, timeout, echo, prompts_source)
        before = metrics.scrape(base_url)
        label = f"run {i}/{len(runs)} {run.workload.name} c={run.concurrency}"
        if kind == "vllm":
            with progress.Requests(label, None):
                measured = vllm_bench.run_level(target, run, tokenizer=tokenizer or target.model,
                                                temperature=rec.bench.temperature, seed=rec.bench.seed,
                                                ignore_eos=rec.bench.ignore_eos, timeout=timeout, echo=echo)
        else:
            with progress.Requests(label, run.num_prompts) as bar:
                measured = client.run_level(target, run, workload.prompts(run, rec.bench.seed, vocab_size,
                                                                          prompts_source),
                                            temperature=rec.bench.temperature, seed=rec.bench.seed,
                                            ignore_eos=rec.bench.ignore_eos, timeout=timeout,
                                            on_done=lambda _res: bar.advance(), record=record_outputs)
        entry = {
            "workload": run.workload.name, "dataset": run.workload.dataset, "concurrency": run.concurrency,
            "max_concurrency": run.concurrency, "num_prompts": run.num_prompts,
            "input_len": run.workload.input_len if run.workload.dataset == "random" else None,
            "output_len": run.workload.output_len, **measured,
            "spec_decode": metrics.acceptance(before, metrics.scrape(base_url)),
        }
        doc["runs"].append(entry)
        echo(format_run(entry))
        if on_run is not None:
            on_run(doc)
        if entry["completed"] == 0:
            raise LauncherError(f"{run.key}: every request failed: {'; '.join(entry['errors']) or 'no error text'}")
    return doc


def _warm_up(target: Target, rec: Recipe, timeout: float) -> None:
    """One short request first, so the first measured TTFT is not the server's warm-up."""
    res = client.one_request(target, "Hello", max_tokens=8, temperature=0.0, seed=rec.bench.seed, ignore_eos=False,
                             timeout=timeout)
    if not res.ok:
        raise LauncherError(f"a first request to {target.base_url}/v1/completions failed: {res.error}")


# Output tokens of each warm-up request: enough decode steps at the level's batch size for the
# kernels it needs (Triton compiles them on first use), short next to a measured request.
WARM_UP_TOKENS = 16


def _warm_level(target: Target, run: workload.Run, rec: Recipe, vocab_size: int | None, timeout: float,
                echo: Echo, prompts_source: list | None = None) -> None:
    """One unmeasured round of the level before it is measured: its first ``concurrency``
    prompts in flight at once, so the batch shapes the level runs (their prefill together,
    decode at that batch) are compiled before the clock starts. vLLM compiles some Triton
    kernels on first use (its log: "Triton kernel JIT compilation during inference"): on an
    H100 the fused-MoE kernel's first prefill of a new size added about a second to the first
    measured TTFT of each level. The requests carry a ``cache_salt`` of their own, so their
    prefill runs in full and the measured requests find none of it in the prefix cache."""
    prompts = workload.prompts(run, rec.bench.seed, vocab_size, prompts_source)[:run.concurrency]
    res = client.run_level(target, run, prompts, temperature=rec.bench.temperature, seed=rec.bench.seed,
                           ignore_eos=True, timeout=timeout, max_tokens=WARM_UP_TOKENS,
                           extra={"cache_salt": warm_up_salt(run)})
    if res["failed"]:
        # The level is measured anyway (its own errors say what is wrong), but cold: say so.
        echo(f"warm-up of {run.key}: {res['failed']} of {len(prompts)} requests failed "
             f"({'; '.join(res['errors'][:1])}); the level is measured without it")


def warm_up_salt(run: workload.Run) -> str:
    """A salt no measured request shares, in what vLLM accepts (0.33.0: at most 128 characters,
    none of ``@ / \\`` or NUL)."""
    level = re.sub(r"[^A-Za-z0-9._-]", "-", f"{run.workload.name}-c{run.concurrency}")
    return f"launcher-bench-warm-up-{level}-{uuid.uuid4().hex}"[-128:]


def metric(run: dict, stat: str, name: str) -> float | None:
    """``mean``/``p99``... of ``ttft``/``tpot``... from a run, in ms; also from results written
    before the flat keys (``{"ttft_ms": {"mean": ...}}``), so older --baseline-result files still compare."""
    value = run.get(f"{stat}_{name}_ms")
    if value is None and isinstance(run.get(f"{name}_ms"), dict):
        value = run[f"{name}_ms"].get(stat)
    return value if isinstance(value, (int, float)) else None


def _ms(run: dict, stat: str, name: str) -> str:
    value = metric(run, stat, name)
    return "-" if value is None else f"{value:.1f}"


def format_run(entry: dict) -> str:
    spec = entry.get("spec_decode") or {}
    accept = (f"  accept {spec['acceptance_rate_pct']:.1f}% len {spec['mean_acceptance_length']:.2f}"
              if spec.get("acceptance_rate_pct") is not None else "")
    failed = f"  FAILED {entry['failed']}" if entry.get("failed") else ""
    out = entry.get("output_throughput")
    return (f"  {entry['workload']:>8} c={entry['concurrency']:<3} out {out or 0.0:8.1f} tok/s  "
            f"TTFT mean {_ms(entry, 'mean', 'ttft')} / p99 {_ms(entry, 'p99', 'ttft')} ms  "
            f"TPOT mean {_ms(entry, 'mean', 'tpot')} / p99 {_ms(entry, 'p99', 'tpot')} ms{accept}{failed}")


def compare(with_drafter: dict, without: dict) -> list[dict]:
    """Run by run: the drafter's effect on throughput and latency."""
    base = {(r.get("workload"), r.get("concurrency")): r for r in without["runs"] if isinstance(r, dict)}
    rows = []
    for run in with_drafter["runs"]:
        other = base.get((run["workload"], run["concurrency"]))
        if other is None:
            continue
        mine, theirs = run.get("output_throughput"), other.get("output_throughput")
        speedup = mine / theirs if mine is not None and theirs else None
        rows.append({
            "workload": run["workload"], "concurrency": run["concurrency"],
            # how many requests each side's figures rest on
            "requests": {"with_drafter": run.get("completed"), "without": other.get("completed")},
            "output_tok_s": {"with_drafter": mine, "without": theirs},
            "speedup": speedup,
            "ttft_ms_mean": {"with_drafter": metric(run, "mean", "ttft"), "without": metric(other, "mean", "ttft")},
            "tpot_ms_mean": {"with_drafter": metric(run, "mean", "tpot"), "without": metric(other, "mean", "tpot")},
            "mean_acceptance_length": (run.get("spec_decode") or {}).get("mean_acceptance_length"),
        })
    return rows


def format_comparison(rows: list[dict]) -> list[str]:
    lines = ["with drafter vs without (same recipe, same workload):",
             f"  {'workload':>8} {'c':>4} {'tok/s with':>11} {'without':>9} {'speedup':>8} {'TPOT with':>10} {'without':>8} {'accept len':>10}"]
    for r in rows:
        sp = f"{r['speedup']:.2f}x" if r["speedup"] is not None else "-"
        al = f"{r['mean_acceptance_length']:.2f}" if r["mean_acceptance_length"] is not None else "-"
        tw, to = r["tpot_ms_mean"]["with_drafter"], r["tpot_ms_mean"]["without"]
        lines.append(f"  {r['workload']:>8} {r['concurrency']:>4} {r['output_tok_s']['with_drafter'] or 0.0:>11.1f} "
                     f"{r['output_tok_s']['without'] or 0.0:>9.1f} {sp:>8} {('-' if tw is None else f'{tw:.1f}'):>10} "
                     f"{('-' if to is None else f'{to:.1f}'):>8} {al:>10}")
    return lines
