"""``vllm bench serve`` for one run, where vLLM is installed.

Flags and result keys are those of vLLM 0.21.0's ``vllm/benchmarks/serve.py``
(``add_cli_args``, and the ``result`` dict it saves with ``--save-result``);
the tests check every flag used here against that released file. The
result is mapped onto the same fields the built-in client reports.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

from launcher.bench.client import Target
from launcher.bench.workload import PROMPTS_FILE, Run
from launcher.errors import LauncherError


def available() -> bool:
    return shutil.which("vllm") is not None


def argv(target: Target, run: Run, *, tokenizer: str, temperature: float, seed: int, ignore_eos: bool,
         result_dir: Path, result_file: str) -> list[str]:
    w = run.workload
    args = [
        "vllm", "bench", "serve",
        "--backend", "openai", "--base-url", target.base_url, "--endpoint", "/v1/completions",
        "--model", target.model, "--tokenizer", tokenizer,
        "--num-prompts", str(run.num_prompts), "--max-concurrency", str(run.concurrency),
        "--temperature", f"{temperature:g}", "--seed", str(seed),
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
        "--save-result", "--result-dir", str(result_dir), "--result-filename", result_file,
        "--disable-tqdm",
    ]
    if ignore_eos:
        args.append("--ignore-eos")
    if w.dataset == "random":
        args += ["--dataset-name", "random", "--random-input-len", str(w.input_len), "--random-output-len", str(w.output_len)]
    else:
        args += ["--dataset-name", "custom", "--dataset-path", str(PROMPTS_FILE), "--custom-output-len", str(w.output_len),
                 "--skip-chat-template"]
    return args


def run_level(target: Target, run: Run, *, tokenizer: str, temperature: float, seed: int, ignore_eos: bool,
              timeout: float, echo) -> dict:
    with tempfile.TemporaryDirectory(prefix="launcher-bench-") as tmp:
        cmd = argv(target, run, tokenizer=tokenizer, temperature=temperature, seed=seed, ignore_eos=ignore_eos,
                   result_dir=Path(tmp), result_file="result.json")
        echo("    " + shlex.join(cmd))
        env = dict(os.environ)
        if target.api_key:
            env["OPENAI_API_KEY"] = target.api_key  # how vllm bench's openai backend takes the key
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise LauncherError(f"vllm bench serve did not finish {run.key} within {timeout:g} s",
                                hint="pass a larger --timeout, or fewer requests") from None
        except OSError as exc:
            raise LauncherError(f"cannot run vllm bench serve ({cmd[0]}): {exc.strerror}",
                                hint="--client builtin measures without vLLM") from None
        if proc.returncode != 0:
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
            raise LauncherError(f"vllm bench serve failed for {run.key} (exit {proc.returncode}):\n{tail}",
                                hint="--client builtin measures without vLLM")
        path = Path(tmp) / "result.json"
        if not path.is_file():
            raise LauncherError(f"vllm bench serve wrote no result file for {run.key}")
        return from_result(json.loads(path.read_text(encoding="utf-8")))


_METRIC_KEY = re.compile(r"^(mean|median|std|p\d+(\.\d+)?)_(ttft|tpot|itl|e2el)_ms$")
_TOTALS = ("completed", "failed", "duration", "total_input_tokens", "total_output_tokens", "request_throughput",
           "output_throughput", "total_token_throughput")


def from_result(data: dict) -> dict:
    """vllm bench serve's saved result, its flat keys as they are (the per-request lists left out)."""
    if not isinstance(data, dict):
        raise LauncherError("vllm bench serve saved a result that is not a JSON object")
    out = {key: data.get(key) for key in _TOTALS}
    out["failed"] = out["failed"] or 0
    out["errors"] = sorted({e for e in data.get("errors") or [] if isinstance(e, str) and e})[:5]
    out.update({k: v for k, v in data.items() if _METRIC_KEY.match(k)})
    if data.get("spec_decode_acceptance_rate") is not None:
        out["vllm_reported_spec_decode"] = {
            "acceptance_rate_pct": data.get("spec_decode_acceptance_rate"),
            "mean_acceptance_length": data.get("spec_decode_acceptance_length"),
        }
    return out
