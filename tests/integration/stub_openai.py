"""A stub OpenAI-compatible server on 127.0.0.1 standing in for a GPU-bound
``vllm serve``: ``/health``, ``/v1/models``, streaming ``/v1/completions``,
``/v1/chat/completions`` (plain and streamed, with vLLM's logprobs and
``return_tokens_as_token_ids``; completions with ``return_token_ids``), ``/tokenize`` and a Prometheus ``/metrics``
with vLLM 0.21.0's speculative-decoding counters.

Chat answers are greedy-like: the token ids are a function of the request's
messages alone (a different image gives other tokens, the same request the
same tokens on every server), so tests/gpu/runs/served.py's verdicts can be run here.

Its behaviour is set, so tests know the truth to compare against: the first
chunk comes after ``ttft_s``, then one chunk every ``chunk_s`` carrying
``tokens_per_chunk`` tokens. With ``drafter=True`` each chunk after the first
counts as one draft of ``num_spec_tokens`` tokens of which
``tokens_per_chunk - 1`` were accepted (the last token of a step is the
target's own), split over two engines' series as a multi-engine vLLM does.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler

from tests.integration.local_http import LocalHTTP


@dataclass
class Behaviour:
    model: str = "gemma4"
    ttft_s: float = 0.02
    chunk_s: float = 0.002
    tokens_per_chunk: int = 1
    drafter: bool = False
    num_spec_tokens: int = 15
    api_key: str | None = None
    # Misbehaviours a real server may show (issue 28.6):
    keepalives: int = 0  # SSE comments sent before the first token, one every keepalive_s
    keepalive_s: float = 0.05
    models_body: object = None  # answer /v1/models with this JSON instead of the model list
    event_form: str = "object"  # "list": events are JSON lists; "string-choices": choices hold strings
    fail_after: int | None = None  # completions after this many answer HTTP 500
    cut_after: int | None = None  # text chunks sent before the connection closes (no usage, no [DONE])
    short_by: int = 0  # tokens fewer than max_tokens, in a stream that ends properly
    misbehave_from: int = 1  # cut_after and short_by apply from this completion on (2: the first one is served whole)
    token_ids: bool = True  # answer return_token_ids (False: a server that ignores it)
    textless_from: int | None = None  # chunks from this one on carry token ids but no text (held-back bytes)


class StubServer(LocalHTTP):
    def __init__(self, behaviour: Behaviour, port: int = 0):
        self.b = behaviour
        self.lock = threading.Lock()
        self.drafts = [0, 0]
        self.draft_tokens = [0, 0]
        self.accepted = [0, 0]
        self.per_pos = [[0] * behaviour.num_spec_tokens for _ in range(2)]
        self.completions = 0
        self.bodies: list[dict] = []
        self.chats: list[dict] = []
        self.prefixes: set[str] = set()
        self._listen(port)

    def _count_step(self, engine: int) -> None:
        accepted = self.b.tokens_per_chunk - 1
        with self.lock:
            self.drafts[engine] += 1
            self.draft_tokens[engine] += self.b.num_spec_tokens
            self.accepted[engine] += accepted
            for pos in range(accepted):
                self.per_pos[engine][pos] += 1

    def metrics_text(self) -> str:
        lines = ["# HELP vllm:num_requests_running Number of requests in model execution batches.",
                 "# TYPE vllm:num_requests_running gauge",
                 f'vllm:num_requests_running{{engine="0",model_name="{self.b.model}"}} 0.0',
                 f'vllm:generation_tokens_total{{engine="0",model_name="{self.b.model}"}} 123.0']
        if self.b.drafter:
            with self.lock:
                for name, values in (("num_drafts", self.drafts), ("num_draft_tokens", self.draft_tokens),
                                     ("num_accepted_tokens", self.accepted)):
                    lines.append(f"# TYPE vllm:spec_decode_{name} counter")
                    for engine, value in enumerate(values):
                        labels = f'engine="{engine}",model_name="{self.b.model}"'
                        lines.append(f"vllm:spec_decode_{name}_total{{{labels}}} {float(value)}")
                        lines.append(f"vllm:spec_decode_{name}_created{{{labels}}} 1.7e9")
                lines.append("# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter")
                for engine, row in enumerate(self.per_pos):
                    for pos, value in enumerate(row):
                        labels = f'engine="{engine}",model_name="{self.b.model}",position="{pos}"'
                        lines.append(f"vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels}}} {float(value)}")
        return "\n".join(lines) + "\n"

    def _handler(self):
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _authorized(self) -> bool:
                if stub.b.api_key and self.headers.get("Authorization") != f"Bearer {stub.b.api_key}":
                    self._json(401, {"error": "unauthorized"})
                    return False
                return True

            def do_GET(self) -> None:
                if self.path == "/health":
                    return self._json(200, {})
                if self.path == "/metrics":
                    body = stub.metrics_text().encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain; version=0.0.4")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                elif self.path == "/v1/models":
                    if self._authorized():
                        self._json(200, stub.b.models_body if stub.b.models_body is not None else
                                   {"object": "list", "data": [{"id": stub.b.model, "object": "model"}]})
                else:
                    self._json(404, {"error": "not found"})

            def do_POST(self) -> None:
                if self.path in ("/v1/chat/completions", "/tokenize"):
                    body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                    if self.path == "/tokenize":
                        return self._json(200, tokenize_response(body))
                    return chat_response(stub, self, body)
                if self.path != "/v1/completions":
                    return self._json(404, {"error": "not found"})
                if not self._authorized():
                    return
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with stub.lock:
                    stub.bodies.append(body)
                    stub.completions += 1
                    engine = stub.completions % 2
                if body.get("model") != stub.b.model:
                    return self._json(404, {"error": f"model {body.get('model')} does not exist"})
                if stub.b.fail_after is not None and stub.completions > stub.b.fail_after:
                    return self._json(500, {"error": "the engine died"})
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                self.close_connection = True
                prompt = body["prompt"]
                prompt_tokens = len(prompt) if isinstance(prompt, list) else len(str(prompt).split())
                misbehave = stub.completions >= stub.b.misbehave_from
                left = int(body["max_tokens"]) - (stub.b.short_by if misbehave else 0)
                sent = left
                for _ in range(stub.b.keepalives):
                    self.wfile.write(b": keep-alive\n\n")
                    self.wfile.flush()
                    time.sleep(stub.b.keepalive_s)
                time.sleep(stub.b.ttft_s)
                first = True
                ids = completion_tokens(prompt, sent) if body.get("return_token_ids") and stub.b.token_ids else None
                while left > 0:
                    n = min(stub.b.tokens_per_chunk, left)
                    if not first:
                        time.sleep(stub.b.chunk_s)
                        if stub.b.drafter:
                            stub._count_step(engine)
                    first = False
                    left -= n
                    quiet = stub.b.textless_from is not None and (sent - left) // max(n, 1) >= stub.b.textless_from
                    chunk = {"index": 0, "text": "" if quiet else " tok" * n, "finish_reason": None if left else "length"}
                    if ids is not None:
                        chunk["token_ids"] = ids[sent - left - n:sent - left]
                    self._event({"object": "text_completion", "choices": [chunk]})
                    if misbehave and stub.b.cut_after is not None and sent - left >= stub.b.cut_after:
                        return  # the handler closes the connection: a cut stream
                self._event({"object": "text_completion", "choices": [],
                             "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": sent}})
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()

            def _event(self, data: dict) -> None:
                if stub.b.event_form == "list":
                    data = [data]
                elif stub.b.event_form == "string-choices":
                    data = {**data, "choices": [c.get("text", "") for c in data.get("choices", [])]}
                self.wfile.write(f"data: {json.dumps(data)}\n\n".encode())
                self.wfile.flush()

            def _json(self, code: int, data: dict) -> None:
                body = json.dumps(data).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        return Handler


# ------------------------------------------------------------------ chat


def _prompt_text(messages: list[dict]) -> str:
    """The request's messages as one string; an image part is its URL (its bytes)."""
    parts = []
    for m in messages:
        content = m["content"]
        if isinstance(content, str):
            parts.append(f"{m['role']}:{content}")
            continue
        for p in content:
            parts.append(f"{m['role']}:" + (p["text"] if p["type"] == "text" else p["image_url"]["url"]))
    return "\n".join(parts)


def completion_tokens(prompt, n: int) -> list[int]:
    """The ``n`` token ids the stub completes ``prompt`` with (text or ids; from a hash of it)."""
    seed = int(hashlib.sha256(json.dumps(prompt).encode()).hexdigest()[:8], 16)
    return [100 + (seed + 31 * i * i) % 7000 for i in range(n)]


def chat_tokens(messages: list[dict], n: int) -> list[int]:
    """The ``n`` token ids the stub answers ``messages`` with (from a hash of them)."""
    seed = int(hashlib.sha256(_prompt_text(messages).encode()).hexdigest()[:8], 16)
    return [100 + (seed + 37 * i * i) % 7000 for i in range(n)]


def chat_response(self: StubServer, handler, body: dict) -> None:
    """vLLM's chat completion shape: choices[0].message / delta, logprobs.content with
    top_logprobs (the sampled token first), usage with prompt_tokens_details."""
    with self.lock:
        self.chats.append(body)
    if body.get("model") != self.b.model:
        return handler._json(404, {"error": f"model {body.get('model')} does not exist"})
    n = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
    ids = chat_tokens(body["messages"], n)
    as_ids = body.get("return_tokens_as_token_ids")
    name = (lambda t: f"token_id:{t}") if as_ids else (lambda t: f"t{t}")
    k = int(body.get("top_logprobs") or 0)

    def logprob(i: int, t: int) -> dict:
        top = [{"token": name(t), "logprob": 20.0, "bytes": None}] + \
              [{"token": name(t + j), "logprob": 20.0 - 1.5 * j, "bytes": None} for j in range(1, k)]
        return {"token": name(t), "logprob": 20.0, "bytes": None, "top_logprobs": top[:k]}

    prompt = _prompt_text(body["messages"])
    prompt_tokens = len(prompt.split())
    with self.lock:  # "cached": the longest earlier prompt this one starts with, in whole 16-token blocks
        cached = max((len(p.split()) for p in self.prefixes if prompt.startswith(p) and p != prompt), default=0)
        self.prefixes.add(prompt)
    if self.b.drafter:  # _count_step takes the lock itself
        for _ in range(n // 4):
            self._count_step(0)
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n}
    if cached:
        usage["prompt_tokens_details"] = {"cached_tokens": cached // 16 * 16}
    text = "".join(f" w{t}" for t in ids)
    tool_calls = [] if body.get("tools") else None
    if not body.get("stream"):
        choice = {"index": 0, "finish_reason": "length",
                  "message": {"role": "assistant", "content": text, "tool_calls": tool_calls or []},
                  "logprobs": {"content": [logprob(i, t) for i, t in enumerate(ids)]} if body.get("logprobs") else None}
        return handler._json(200, {"id": "chatcmpl-stub", "object": "chat.completion", "created": 0,
                                   "model": self.b.model, "choices": [choice], "usage": usage})
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream")
    handler.send_header("Connection", "close")
    handler.end_headers()
    handler.close_connection = True
    step = max(1, self.b.tokens_per_chunk)
    for i in range(0, n, step):
        part = ids[i:i + step]
        choice = {"index": 0, "delta": {"content": "".join(f" w{t}" for t in part)},
                  "finish_reason": "length" if i + step >= n else None,
                  "logprobs": {"content": [logprob(i + j, t) for j, t in enumerate(part)]} if body.get("logprobs") else None}
        handler._event({"id": "chatcmpl-stub", "object": "chat.completion.chunk", "created": 0,
                        "model": self.b.model, "choices": [choice]})
    if (body.get("stream_options") or {}).get("include_usage"):
        handler._event({"id": "chatcmpl-stub", "object": "chat.completion.chunk", "created": 0,
                        "model": self.b.model, "choices": [], "usage": usage})
    handler.wfile.write(b"data: [DONE]\n\n")
    handler.wfile.flush()


def tokenize_response(body: dict) -> dict:
    """A prompt's ids: one id per word, an image as the Gemma 4 span (boi, 64 x image, eoi)."""
    ids: list[int] = [2]
    for m in body.get("messages") or []:
        content = m["content"] if isinstance(m["content"], list) else [{"type": "text", "text": m["content"]}]
        for p in content:
            ids += [7] + [9] * 64 + [8] if p["type"] == "image_url" else [50] * len(p["text"].split())
    return {"count": len(ids), "tokens": ids, "max_model_len": 4096}

