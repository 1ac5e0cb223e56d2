"""The built-in load client: streaming ``/v1/completions`` requests, measured
the way ``vllm bench serve`` measures them, for hosts without vLLM.

Per request: TTFT is the time to the first streamed text; TPOT is
(latency - TTFT) / (output tokens - 1); ITLs are the gaps between streamed
chunks. Output tokens come from the final ``usage`` chunk (asked for with
``stream_options.include_usage``), because with a drafter one chunk can carry
several tokens. At concurrency c, c worker threads keep c requests in flight
until every prompt has been sent (request rate unbounded, as vllm's default).
"""

from __future__ import annotations

import http.client
import json
import statistics
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Callable
from dataclasses import dataclass, field

from launcher.bench.workload import Run


@dataclass
class RequestResult:
    ok: bool
    start: float
    ttft: float | None = None
    latency: float = 0.0
    prompt_tokens: int = 0
    output_tokens: int = 0
    itls: list[float] = field(default_factory=list)
    error: str | None = None
    # the generated token ids, where the request asked for them (--record-outputs)
    token_ids: list[int] | None = None


@dataclass(frozen=True)
class Target:
    """Where to send requests and as whom (the key is never printed)."""

    base_url: str
    model: str
    api_key: str | None = None


def _post_stream(target: Target, body: dict, timeout: float):
    url = urllib.parse.urlsplit(target.base_url)
    conn_cls = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
    conn = conn_cls(url.hostname, url.port, timeout=timeout)
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if target.api_key:
        headers["Authorization"] = f"Bearer {target.api_key}"
    conn.request("POST", url.path.rstrip("/") + "/v1/completions", body=json.dumps(body), headers=headers)
    return conn, conn.getresponse()


def one_request(target: Target, prompt, *, max_tokens: int, temperature: float, seed: int, ignore_eos: bool,
                timeout: float, extra: dict | None = None, record: bool = False) -> RequestResult:
    """One streamed completion; ``timeout`` bounds the whole request, not each read. ``record``:
    keep the generated token ids (vLLM's ``return_token_ids``, in both covered releases: each
    streamed choice carries the ids of its delta).

    A server that sends an SSE comment (a keep-alive) every second would
    otherwise never hit a per-read timeout, and the run would never end.
    """
    body = {
        "model": target.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": temperature,
        "seed": seed, "ignore_eos": ignore_eos, "stream": True, "stream_options": {"include_usage": True},
        **(extra or {}),
    }
    if record:
        body["return_token_ids"] = True
    start = time.perf_counter()
    deadline = start + timeout
    result = RequestResult(ok=False, start=start, token_ids=[] if record else None)
    conn = None
    try:
        conn, resp = _post_stream(target, body, timeout)
        if resp.status != 200:
            result.error = f"HTTP {resp.status}: {resp.read(300).decode('utf-8', 'replace')}"
            return result
        last = start
        chunks = 0
        done = False
        finish: str | None = None
        for raw in resp:
            left = deadline - time.perf_counter()
            if left <= 0:
                raise TimeoutError(f"no complete answer within --timeout {timeout:g} s")
            if conn.sock is not None:
                conn.sock.settimeout(left)  # the next read may not outlast the request's deadline
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                break
            event = _event(data)
            finish = next((c["finish_reason"] for c in _choices(event) if c.get("finish_reason")), finish)
            usage = event.get("usage")
            if isinstance(usage, dict):
                result.prompt_tokens = int(usage.get("prompt_tokens") or 0)
                result.output_tokens = int(usage.get("completion_tokens") or 0)
            ids = _token_ids(_choices(event)) if record else []
            if record:
                result.token_ids += ids
            # a chunk of token ids whose text the detokenizer holds back (a byte of a character)
            # still brought tokens: it times the first token and the gaps as a text chunk does
            if ids or any(c.get("text") for c in _choices(event)):
                now = time.perf_counter()
                if result.ttft is None:
                    result.ttft = now - start
                else:
                    result.itls.append(now - last)
                last = now
                chunks += 1
        result.latency = time.perf_counter() - start
        result.output_tokens = result.output_tokens or chunks
        result.error = _incomplete(result, done, finish, max_tokens, ignore_eos)
        if record and result.error is None and len(result.token_ids) != result.output_tokens:
            result.error = (f"asked for its token ids, the server sent {len(result.token_ids)} for "
                            f"{result.output_tokens} tokens (does it support return_token_ids?)")
        result.ok = result.error is None
    except (OSError, http.client.HTTPException, ValueError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        if conn is not None:
            conn.close()
    return result


def _incomplete(result: RequestResult, done: bool, finish: str | None, max_tokens: int, ignore_eos: bool) -> str | None:
    """Why a stream does not count as a finished request, or None.

    A proxy or a dying server can cut a stream after a chunk or two; counted
    as finished, it would make the server look fast. A finished stream ends
    with ``data: [DONE]`` and carries the tokens asked for, or fewer only
    when the model stopped by itself (finish_reason "stop", never with
    ignore_eos).
    """
    if result.ttft is None:
        return "the stream ended without any text"
    got = f"{result.output_tokens} of {max_tokens} tokens"
    if not done:
        return f"the stream was cut off before data: [DONE] ({got})"
    if result.output_tokens < max_tokens and (ignore_eos or finish != "stop"):
        why = "with ignore_eos" if ignore_eos else f"finish_reason {finish!r}"
        return f"the server sent {got} ({why})"
    return None


def _event(data: str) -> dict:
    """One SSE ``data:`` payload, which must be a JSON object (ValueError otherwise)."""
    event = json.loads(data)
    if not isinstance(event, dict):
        raise ValueError(f"an SSE event is not a JSON object: {data[:80]}")
    return event


def _token_ids(choices: list[dict]) -> list[int]:
    """The token ids the choices of one streamed event carry (``return_token_ids``)."""
    out: list[int] = []
    for c in choices:
        ids = c.get("token_ids") or []
        if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
            raise ValueError(f"an SSE event's token_ids are not a list of integers: {json.dumps(ids)[:80]}")
        out += ids
    return out


def _choices(event: dict) -> list[dict]:
    choices = event.get("choices") or []
    if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
        raise ValueError(f"an SSE event's choices are not a list of objects: {json.dumps(choices)[:80]}")
    return choices


def run_level(target: Target, run: Run, prompts: list, *, temperature: float, seed: int, ignore_eos: bool,
              timeout: float, on_done: Callable[[RequestResult], None] | None = None,
              max_tokens: int | None = None, extra: dict | None = None, record: bool = False) -> dict:
    """Send every prompt of ``run`` with ``run.concurrency`` in flight; return vllm-style metrics.

    ``on_done`` hears of each finished request (progress), from the worker threads;
    ``max_tokens`` replaces the workload's output length and ``extra`` adds to each request's
    body (the warm-up's short, salted requests). ``record``: also ``outputs``, each request's
    generated token ids in prompt order (None for a request that failed), so that what the
    measured server said can be judged (a looping output is fast to draft).
    """

    def send(i_prompt):
        i, prompt = i_prompt
        res = one_request(target, prompt, max_tokens=max_tokens or run.workload.output_len, temperature=temperature,
                          seed=seed + i, ignore_eos=ignore_eos, timeout=timeout, extra=extra, record=record)
        if on_done is not None:
            on_done(res)
        return res

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=run.concurrency) as pool:
        results = list(pool.map(send, enumerate(prompts)))
    duration = time.perf_counter() - t0
    out = summarize(results, duration)
    if record:
        out["outputs"] = [r.token_ids if r.ok else None for r in results]
    return out


def summarize(results: list[RequestResult], duration: float) -> dict:
    """The keys ``vllm bench serve --save-result`` writes (flat: ``mean_ttft_ms``, ``p99_tpot_ms``, ...),
    so scripts that read its results read these too."""
    done = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in done)
    in_tokens = sum(r.prompt_tokens for r in done)
    ttfts = [r.ttft * 1000 for r in done if r.ttft is not None]
    tpots = [(r.latency - r.ttft) * 1000 / (r.output_tokens - 1) for r in done if r.output_tokens > 1 and r.ttft is not None]
    itls = [x * 1000 for r in done for x in r.itls]
    e2els = [r.latency * 1000 for r in done]
    out = {
        "completed": len(done),
        "failed": len(results) - len(done),
        "errors": sorted({r.error for r in results if r.error})[:5],
        "duration": duration,
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "request_throughput": len(done) / duration if duration > 0 else 0.0,
        "output_throughput": out_tokens / duration if duration > 0 else 0.0,
        "total_token_throughput": (in_tokens + out_tokens) / duration if duration > 0 else 0.0,
    }
    for name, values in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)):
        out.update(stats(name, values))
    return out


PERCENTILES = (50, 99)


def stats(name: str, values: list[float]) -> dict:
    """mean/median/std/p50/p99 of one metric in ms, named as vllm bench serve names them (None: no value)."""
    keys = [f"mean_{name}_ms", f"median_{name}_ms", f"std_{name}_ms", *(f"p{p}_{name}_ms" for p in PERCENTILES)]
    if not values:
        return dict.fromkeys(keys)
    ordered = sorted(values)
    return dict(zip(keys, [statistics.fmean(values), statistics.median(values), statistics.pstdev(values),
                           *(_percentile(ordered, p) for p in PERCENTILES)]))


def _percentile(ordered: list[float], p: float) -> float:
    """Linear interpolation between closest ranks (numpy's default, which vllm bench uses)."""
    rank = (len(ordered) - 1) * p / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)
