"""``launcher bench``: option parsing and the result file; the work is in ``runner``."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from launcher.errors import LauncherError

_NO_BASELINE_HINT = (
    "serve the same recipe without its drafter on another port, e.g. "
    "`launcher serve --recipe {name} --set drafter=null --port 8001`, then pass --baseline-url http://127.0.0.1:8001 "
    "(or --baseline-result with the JSON of an earlier run against such a server)"
)


def bench(
    recipe: Annotated[str, typer.Option("--recipe", "-r", help="Recipe whose bench: workloads to run (launcher recipes list).")],
    url: Annotated[str, typer.Option("--url", help="Server base URL (default: where `launcher serve` listens).")] = "http://127.0.0.1:8000",
    model: Annotated[Optional[str], typer.Option("--model", help="Served model name (default: the recipe's, else the server's first).")] = None,
    profile: Annotated[Optional[str], typer.Option("--profile", help="Profile whose max_num_seqs is concurrency 'max' (default: the recipe's).")] = None,
    workload_: Annotated[list[str], typer.Option("--workload", help="Run only these workloads of the recipe (repeatable).")] = [],
    client: Annotated[str, typer.Option("--client", help="auto (vllm bench serve when installed) | vllm | builtin.")] = "auto",
    tokenizer: Annotated[Optional[str], typer.Option("--tokenizer", help="The served model's folder (or, for vllm bench serve, a tokenizer repo); default: the recipe's model folder if present. A folder's vocabulary bounds the random prompts' token ids.")] = None,
    api_key: Annotated[Optional[str], typer.Option("--api-key", help="API key of the server (default: $VLLM_API_KEY); never printed.")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", help="Result JSON (default: bench-<recipe>-<UTC time>.json here).")] = None,
    compare_without_drafter: Annotated[bool, typer.Option("--compare-without-drafter", help="Also print the same workloads on the recipe without its drafter.")] = False,
    baseline_url: Annotated[Optional[str], typer.Option("--baseline-url", help="A server running the recipe without its drafter (with --compare-without-drafter).")] = None,
    baseline_result: Annotated[Optional[Path], typer.Option("--baseline-result", help="Or: the JSON of an earlier `launcher bench` run against such a server.")] = None,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds per request (built-in client) or per run (vllm bench).")] = 600.0,
    concurrency: Annotated[Optional[str], typer.Option("--concurrency", help="Run every workload at these levels instead of the recipe's, e.g. 1,4,16,max ('max': the profile's max_num_seqs).")] = None,
    min_requests: Annotated[Optional[int], typer.Option("--min-requests", help="At least this many measured requests per level (default: the level's concurrency x the workload's prompts_per_stream).")] = None,
    prompts_file: Annotated[Optional[Path], typer.Option("--prompts-file", help='Your own prompts for the "prompts" workloads instead of the bundled set: JSONL, {"prompt": "text"} or {"prompt": [token ids]} a line, cycled (built-in client).')] = None,
    output_len: Annotated[Optional[int], typer.Option("--output-len", help="Output tokens per request for every workload instead of the recipe's.")] = None,
    record_outputs: Annotated[bool, typer.Option("--record-outputs", help="Keep each request's generated token ids in the result (runs[].outputs), to judge what the server said (built-in client).")] = False,
) -> None:
    """Benchmark a running server with the recipe's workloads: output tok/s, TTFT, TPOT, and the
    drafter's acceptance rate/length from /metrics; writes JSON."""
    from launcher import recipe as recipes
    from launcher.bench import runner

    if not math.isfinite(timeout) or timeout <= 0:
        raise LauncherError(f"--timeout {timeout:g}: seconds per request must be more than 0")
    for flag, value in (("--url", url), ("--baseline-url", baseline_url)):
        _check_url(flag, value)
    url, baseline_url = _server_root(url), _server_root(baseline_url)
    rec = recipes.load(recipe)
    from launcher.bench import workload as workloads

    levels = workloads.parse_levels(concurrency) if concurrency is not None else None
    if min_requests is not None and min_requests < 1:
        raise LauncherError(f"--min-requests {min_requests}: at least 1 request per level")
    if output_len is not None and output_len < 1:
        raise LauncherError(f"--output-len {output_len}: at least 1 token per request")
    source = _prompt_set(prompts_file, record_outputs, client, rec, list(workload_))
    identity = _file_identity(prompts_file, len(source)) if prompts_file is not None else None
    if (baseline_url or baseline_result) and not compare_without_drafter:
        raise LauncherError("--baseline-url/--baseline-result need --compare-without-drafter")
    if compare_without_drafter:
        if rec.drafter is None:
            raise LauncherError(f"recipe {rec.name} has no drafter to compare without")
        if bool(baseline_url) == bool(baseline_result):
            raise LauncherError("--compare-without-drafter needs one of --baseline-url or --baseline-result",
                                hint=_NO_BASELINE_HINT.format(name=rec.name))
    # Everything that can be refused is refused before the first request: a run takes minutes.
    path = out or Path(f"bench-{rec.name}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json")
    _check_out(path)
    earlier = _read_baseline(baseline_result, rec.name) if compare_without_drafter and baseline_result else None
    if earlier is not None:
        _check_same_prompts(earlier, baseline_result, identity)
        _check_same_lengths(earlier, baseline_result, rec, output_len)
    key = api_key or os.environ.get("VLLM_API_KEY") or None
    _check_tokenizer(tokenizer)
    tok = tokenizer or _local_model(rec)
    kwargs = dict(levels=levels, min_requests=min_requests, model=model, api_key=key, profile=profile, only=list(workload_) or None, client_choice=client,
                  tokenizer=tok, timeout=timeout, echo=typer.echo, vocab_size=workloads.vocab_size(tok),
                  prompts_source=source, output_len=output_len, record_outputs=record_outputs,
                  prompt_set=identity)
    # Each finished run is written at once, so an error or Ctrl-C later loses none of it.
    doc = runner.bench(rec, base_url=url, on_run=lambda partial: _save_progress(path, partial), **kwargs)
    if compare_without_drafter:
        if earlier is None:
            typer.echo("baseline (without the drafter):")
            earlier = runner.bench(rec, base_url=baseline_url, on_run=lambda partial: _save_progress(
                path, {**doc, "without_drafter": partial}), **kwargs)
        baseline = earlier
        _check_pair(doc, baseline)
        doc["without_drafter"] = baseline
        doc["comparison"] = runner.compare(doc, baseline)
        for line in runner.format_comparison(doc["comparison"]):
            typer.echo(line)
        for line in _break_even_lines(doc):
            typer.echo(line)
    try:
        _write(path, doc)
    except OSError as exc:
        # The measurement took minutes: print it rather than lose it.
        typer.echo(json.dumps(doc, indent=2))
        raise LauncherError(f"writing --out {path} failed ({exc.strerror or exc}); the result is printed above as JSON",
                            hint="free some space (or pick another --out) and save the JSON above") from None
    typer.echo(f"wrote {path}")
    if compare_without_drafter and not doc["comparison"]:
        # measured and written, but the comparison asked for is empty: not a success
        raise LauncherError("nothing compared: no run of the baseline has a workload and concurrency of this run",
                            hint="bench both with the same --profile and --concurrency (the result above is kept)")


def _break_even_lines(doc: dict) -> list[str]:
    """The measured acceptance of each compared run beside the break-even the committed speed-up
    curve measured for the server's K and concurrency (launcher.bench.breakeven)."""
    from launcher.bench import breakeven

    table = breakeven.load()
    runs = {(r.get("workload"), r.get("concurrency")): r for r in doc.get("runs", [])}
    lines = ["break-even (from the committed speed-up curve):"]
    # several workloads at one concurrency would otherwise print lines that read the same
    several = len({row["workload"] for row in doc.get("comparison", [])}) > 1
    for row in doc.get("comparison", []):
        spec = (runs.get((row["workload"], row["concurrency"])) or {}).get("spec_decode")
        lines += breakeven.advice(table, k=breakeven.speculative_tokens(spec) or doc.get("num_speculative_tokens"),
                                  concurrency=row["concurrency"], acceptance=row.get("mean_acceptance_length"),
                                  speedup=row.get("speedup"), vllm=doc.get("server_vllm"),
                                  workload=row["workload"] if several else None)
    return lines


def _prompt_set(prompts_file: Path | None, record_outputs: bool, client: str, rec, only: list[str]) -> list | None:
    """The --prompts-file's prompts (None: the bundled set), refused before any request where it
    cannot take effect: ``vllm bench serve`` reads neither token-id prompts nor returns outputs,
    and a file for workloads that all send random prompts would be ignored in silence."""
    from launcher.bench import runner, workload as workloads

    if (prompts_file is not None or record_outputs) and (client == "vllm" or runner.pick_client(client) == "vllm"):
        flag = "--prompts-file" if prompts_file is not None else "--record-outputs"
        raise LauncherError(f"{flag} needs the built-in client (--client {client} runs vllm bench serve)",
                            hint="add --client builtin")
    if prompts_file is None:
        return None
    source = workloads.load_prompts_file(prompts_file)
    chosen = [w for w in rec.bench.workloads if not only or w.name in only]
    if not any(w.dataset == "prompts" for w in chosen):
        raise LauncherError(f"--prompts-file: no workload run here sends the prompt set "
                            f"({', '.join(f'{w.name}: {w.dataset}' for w in chosen)})",
                            hint='pick a workload whose dataset is "prompts" with --workload')
    return source


def _check_same_prompts(earlier: dict, baseline_result: Path, identity: dict | None) -> None:
    """A baseline measured on other prompts compares nothing: its acceptance-free tok/s would
    stand beside a run whose prompts the drafter finds easier or harder. ``identity``: this
    run's prompt file (_file_identity), None for the bundled set."""
    theirs = (earlier.get("prompts_file") or {}).get("sha256")
    mine = (identity or {}).get("sha256")
    if theirs != mine:
        def said(sha: str | None) -> str:
            return "the bundled prompt set" if sha is None else f"a --prompts-file of sha256 {sha[:12]}"

        raise LauncherError(f"--baseline-result {baseline_result} ran {said(theirs)}, this run {said(mine)}",
                            hint="bench the baseline with the same --prompts-file")


def _check_same_lengths(earlier: dict, baseline_result: Path, rec, output_len: int | None) -> None:
    """A baseline whose requests were of another length compares nothing either: the runs pair
    by workload and concurrency alone, and a shorter request weighs its first token more."""
    planned = {w.name: output_len or w.output_len for w in rec.bench.workloads}
    for run in earlier.get("runs") or []:
        theirs, mine = run.get("output_len"), planned.get(run.get("workload"))
        if theirs is not None and mine is not None and theirs != mine:
            raise LauncherError(f"--baseline-result {baseline_result} ran workload {run.get('workload')} at "
                                f"{theirs} output tokens a request, this run at {mine}",
                                hint="bench the baseline with the same --output-len")


def _file_identity(path: Path, count: int) -> dict:
    import hashlib

    return {"path": str(path), "sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "prompts": count}


def _check_tokenizer(tokenizer: str | None) -> None:
    """A --tokenizer written as a path (absolute, ./, ../ or ~) must be a model folder: one that
    is not was ignored in silence and the prompts drawn from a vocabulary it did not set. A
    repository id (org/name) is vllm bench serve's to resolve."""
    if not tokenizer or not tokenizer.startswith(("/", "./", "../", "~")):
        return
    folder = Path(tokenizer).expanduser()
    if not folder.is_dir():
        raise LauncherError(f"--tokenizer {tokenizer}: no such folder",
                            hint="pass the served model's folder (the one holding its config.json and tokenizer)")


def _check_out(path: Path) -> None:
    """--out must be a file that can be written: checked now, not after the whole run."""
    if path.is_dir():
        raise LauncherError(f"--out {path} is a folder", hint="give a file name, e.g. --out bench.json")
    folder = path.parent
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        raise LauncherError(f"--out {path}: {folder} is a file, not a folder")
    if not os.access(folder, os.W_OK):
        raise LauncherError(f"--out {path}: {folder} is not writable")
    if path.parent.is_dir():
        # A real write, not os.access: /proc, read-only mounts and root all answer truthfully.
        probe = _partial(path)
        try:
            probe.open("w").close()
            probe.unlink()
        except OSError as exc:
            raise LauncherError(f"--out {path} cannot be written: {exc.strerror or exc}") from None


def _partial(path: Path) -> Path:
    return path.with_name(f".{path.name}.partial")


def _write(path: Path, doc: dict) -> None:
    """Write ``doc`` whole or not at all: a failed write leaves no partial file behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _partial(path)
    try:
        tmp.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _save_progress(path: Path, doc: dict) -> None:
    """Runs so far, saved as each one ends; a failed save (a full disk) does not stop the measurement."""
    try:
        _write(path, doc)
    except OSError as exc:
        typer.echo(f"warning: could not save the runs so far to {path}: {exc.strerror or exc}; "
                   "the run goes on", err=True)


def _local_model(rec) -> str | None:
    from launcher.paths import models_dir

    folder = models_dir() / rec.target.name
    if folder.is_dir():
        return str(folder)
    return rec.target.hub.repo if rec.target.hub else None


def _read_baseline(result: Path, recipe: str) -> dict:
    try:
        data = json.loads(result.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise LauncherError(f"--baseline-result {result}: not a readable result JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("runs"), list):
        raise LauncherError(f"--baseline-result {result}: no runs in it (is it a `launcher bench` result?)")
    if data.get("recipe") not in (None, recipe):
        # the comparison says "same recipe": another recipe's numbers would make it false
        raise LauncherError(f"--baseline-result {result} measured recipe {data['recipe']}, not {recipe}",
                            hint=_NO_BASELINE_HINT.format(name=recipe))
    return data


def _check_pair(main: dict, baseline: dict) -> None:
    """Say so when the two servers are not what the comparison claims."""
    if not main.get("speculative_decoding"):
        typer.echo(f"warning: {main['url']} exposes no speculative-decoding metrics: is its drafter on?", err=True)
    if baseline.get("speculative_decoding"):
        typer.echo(f"warning: the baseline {baseline.get('url')} runs speculative decoding too: "
                   "the comparison is not against the recipe without its drafter", err=True)


def register(root: typer.Typer) -> None:
    root.command("bench")(bench)


def _server_root(url: str | None) -> str | None:
    """The server's root: the endpoint `launcher serve` prints ends in /v1, which the requests add
    themselves (http://H:P/v1 was asked for /v1/v1/models and refused with HTTP 404)."""
    if not url:
        return url
    url = url.rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


def _check_url(flag: str, url: str | None) -> None:
    """An http(s) URL with a host, and no key written into it (``http://user:KEY@host``
    would be echoed by every message and result that names the server): refused without
    repeating it. ``not-a-url`` was a ValueError traceback; ``file:///`` read local files."""
    if not url:
        return
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        userinfo = parts.username is not None or parts.password is not None
        scheme, host = parts.scheme.lower(), parts.hostname
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number or out of range
    except ValueError as exc:
        userinfo, scheme, host, bad_port = "@" in url, None, None, str(exc)
    else:
        bad_port = None
    shown = (url.split("://", 1)[0] + "://***@" + url.rsplit("@", 1)[-1]) if "@" in url else url
    if userinfo:
        raise LauncherError(f"{flag} {shown} carries a user name or key in the URL",
                            hint="pass the key with --api-key or VLLM_API_KEY, and the URL without it")
    if scheme not in ("http", "https") or not host or bad_port:
        raise LauncherError(f"{flag} {shown!r} is not an http:// or https:// URL of a server"
                            + (f" ({bad_port})" if bad_port else ""),
                            hint="for example --url http://127.0.0.1:8000")
