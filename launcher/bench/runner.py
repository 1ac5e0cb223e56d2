"""``launcher bench``: a recipe's workloads against a running server, one result document.

For every run (workload x concurrency): scrape ``/metrics``, send the load
(``vllm bench serve`` or the built-in client), scrape again; the difference
of the speculative-decoding counters gives the acceptance of that run alone.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable

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
        hint = "pass --api-key (or set VLLM_API_KEY)" if exc.code == 401 else None
        raise LauncherError(f"{base_url}/v1/models answered HTTP {exc.code}", hint=hint) from None
    except (OSError, ValueError) as exc:
        raise LauncherError(f"no OpenAI-compatible server answers at {base_url} ({exc})",
                            hint="start one (launcher serve --recipe NAME) or pass --url") from None
    return [m.get("id") for m in data.get("data") or [] if m.get("id")]


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
          only: list[str] | None, client_choice: str, tokenizer: str | None, timeout: float, echo: Echo) -> dict:
    base_url = base_url.rstrip("/")
    runs = workload.runs(rec, profile=profile, only=only)
    kind = pick_client(client_choice)
    served = server_models(base_url, api_key)
    target = Target(base_url, choose_model(rec, served, model), api_key)
    _, profile_name = workload.max_concurrency(rec, profile)
    spec_before = metrics.scrape(base_url)
    doc = {
        "recipe": rec.name,
        "url": base_url,
        "model": target.model,
        "client": "vllm bench serve" if kind == "vllm" else "built-in",
        "profile": profile_name,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "speculative_decoding": spec_before is not None,
        "sampling": {"temperature": rec.bench.temperature, "seed": rec.bench.seed, "ignore_eos": rec.bench.ignore_eos},
        "runs": [],
    }
    echo(f"bench {rec.name} -> {base_url} model {target.model} ({doc['client']}, profile {profile_name}, "
         f"speculative decoding {'on' if spec_before is not None else 'off'})")
    _warm_up(target, rec, timeout)
    for run in runs:
        before = metrics.scrape(base_url)
        if kind == "vllm":
            measured = vllm_bench.run_level(target, run, tokenizer=tokenizer or target.model, temperature=rec.bench.temperature,
                                            seed=rec.bench.seed, ignore_eos=rec.bench.ignore_eos, timeout=timeout, echo=echo)
        else:
            measured = client.run_level(target, run, workload.prompts(run, rec.bench.seed), temperature=rec.bench.temperature,
                                        seed=rec.bench.seed, ignore_eos=rec.bench.ignore_eos, timeout=timeout)
        entry = {
            "workload": run.workload.name, "dataset": run.workload.dataset, "concurrency": run.concurrency,
            "num_prompts": run.num_prompts, "input_len": run.workload.input_len if run.workload.dataset == "random" else None,
            "output_len": run.workload.output_len, **measured,
            "spec_decode": metrics.acceptance(before, metrics.scrape(base_url)),
        }
        doc["runs"].append(entry)
        echo(format_run(entry))
        if entry["completed"] == 0:
            raise LauncherError(f"{run.key}: every request failed: {'; '.join(entry['errors']) or 'no error text'}")
    return doc


def _warm_up(target: Target, rec: Recipe, timeout: float) -> None:
    """One short request first, so the first measured TTFT is not the server's warm-up."""
    res = client.one_request(target, "Hello", max_tokens=8, temperature=0.0, seed=rec.bench.seed, ignore_eos=False,
                             timeout=timeout)
    if not res.ok:
        raise LauncherError(f"a first request to {target.base_url}/v1/completions failed: {res.error}")


def _ms(stats: dict, key: str) -> str:
    value = stats.get(key)
    return "-" if value is None else f"{value:.1f}"


def format_run(entry: dict) -> str:
    spec = entry.get("spec_decode") or {}
    accept = (f"  accept {spec['acceptance_rate_pct']:.1f}% len {spec['mean_acceptance_length']:.2f}"
              if spec.get("acceptance_rate_pct") is not None else "")
    failed = f"  FAILED {entry['failed']}" if entry.get("failed") else ""
    return (f"  {entry['workload']:>8} c={entry['concurrency']:<3} out {entry['output_throughput']:8.1f} tok/s  "
            f"TTFT {_ms(entry['ttft_ms'], 'mean')}/{_ms(entry['ttft_ms'], 'p99')} ms  "
            f"TPOT {_ms(entry['tpot_ms'], 'mean')} ms{accept}{failed}")


def compare(with_drafter: dict, without: dict) -> list[dict]:
    """Run by run: the drafter's effect on throughput and latency."""
    base = {(r["workload"], r["concurrency"]): r for r in without["runs"]}
    rows = []
    for run in with_drafter["runs"]:
        other = base.get((run["workload"], run["concurrency"]))
        if other is None:
            continue
        speedup = run["output_throughput"] / other["output_throughput"] if other["output_throughput"] else None
        rows.append({
            "workload": run["workload"], "concurrency": run["concurrency"],
            "output_tok_s": {"with_drafter": run["output_throughput"], "without": other["output_throughput"]},
            "speedup": speedup,
            "ttft_ms_mean": {"with_drafter": run["ttft_ms"]["mean"], "without": other["ttft_ms"]["mean"]},
            "tpot_ms_mean": {"with_drafter": run["tpot_ms"]["mean"], "without": other["tpot_ms"]["mean"]},
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
        lines.append(f"  {r['workload']:>8} {r['concurrency']:>4} {r['output_tok_s']['with_drafter']:>11.1f} "
                     f"{r['output_tok_s']['without']:>9.1f} {sp:>8} {('-' if tw is None else f'{tw:.1f}'):>10} "
                     f"{('-' if to is None else f'{to:.1f}'):>8} {al:>10}")
    return lines
