"""A stub OpenAI-compatible server on 127.0.0.1 standing in for a GPU-bound
``vllm serve``: ``/v1/models``, streaming ``/v1/completions`` and a
Prometheus ``/metrics`` with vLLM 0.21.0's speculative-decoding counters.

Its behaviour is set, so tests know the truth to compare against: the first
chunk comes after ``ttft_s``, then one chunk every ``chunk_s`` carrying
``tokens_per_chunk`` tokens. With ``drafter=True`` each chunk after the first
counts as one draft of ``num_spec_tokens`` tokens of which
``tokens_per_chunk - 1`` were accepted (the last token of a step is the
target's own), split over two engines' series as a multi-engine vLLM does.
"""

from __future__ import annotations

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


class StubServer(LocalHTTP):
    def __init__(self, behaviour: Behaviour):
        self.b = behaviour
        self.lock = threading.Lock()
        self.drafts = [0, 0]
        self.draft_tokens = [0, 0]
        self.accepted = [0, 0]
        self.per_pos = [[0] * behaviour.num_spec_tokens for _ in range(2)]
        self.completions = 0
        self.bodies: list[dict] = []
        self._listen()

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
                left = int(body["max_tokens"])
                for _ in range(stub.b.keepalives):
                    self.wfile.write(b": keep-alive\n\n")
                    self.wfile.flush()
                    time.sleep(stub.b.keepalive_s)
                time.sleep(stub.b.ttft_s)
                first = True
                while left > 0:
                    n = min(stub.b.tokens_per_chunk, left)
                    if not first:
                        time.sleep(stub.b.chunk_s)
                        if stub.b.drafter:
                            stub._count_step(engine)
                    first = False
                    left -= n
                    self._event({"object": "text_completion", "choices": [{"index": 0, "text": " tok" * n}]})
                self._event({"object": "text_completion", "choices": [],
                             "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": int(body["max_tokens"])}})
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
