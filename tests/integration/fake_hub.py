"""A Hugging Face Hub on 127.0.0.1 for tests: the part of its HTTP API that
``huggingface_hub`` uses to download a repo, serving tiny repos generated
here. Never the internet: ``huggingface_hub`` is pointed at it with
``HF_ENDPOINT``.

Routes (as huggingface_hub 1.x calls them):
  GET  /api/models/<owner>/<name>/revision/<rev>   repo info: the commit ("sha")
  GET  /api/models/<owner>/<name>/tree/<rev>       file listing with sizes
  HEAD /<owner>/<name>/resolve/<rev>/<path>        X-Repo-Commit, ETag (X-Linked-Etag: sha256 for *.safetensors), Content-Length
  GET  /<owner>/<name>/resolve/<rev>/<path>        the bytes (Range requests answered with 206)
Errors carry the Hub's ``X-Error-Code`` header (RepoNotFound, RevisionNotFound, GatedRepo).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler

from tests.integration.local_http import LocalHTTP
from urllib.parse import unquote, urlsplit


@dataclass
class Repo:
    files: dict[str, bytes]
    branch: str = "main"
    gated: bool = False
    # File requests refused as (status, X-Error-Code or None, methods): the repo's metadata
    # stays public, as the Hub keeps a gated repo's page and file list public.
    refuse_files: tuple[int, str | None, tuple[str, ...]] | None = None
    # Advertise this size instead of the real one (disk-space tests): nothing
    # that large is ever sent, the pull must refuse before asking for bytes.
    advertised_sizes: dict[str, int] = field(default_factory=dict)

    @property
    def commit(self) -> str:
        digest = hashlib.sha1()
        for name in sorted(self.files):
            digest.update(name.encode() + b"\0" + hashlib.sha1(self.files[name]).digest())
        return digest.hexdigest()

    def size(self, name: str) -> int:
        return self.advertised_sizes.get(name, len(self.files[name]))


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]  # names lower-cased


class FakeHub(LocalHTTP):
    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.seen: list[Seen] = []
        # Paths whose first GET is cut after half the bytes (connection closed):
        # the client must resume with a Range request.
        self.cut_once: set[str] = set()
        self.required_token: str | None = None
        self._listen()

    def requests_for(self, method: str, fragment: str = "") -> list[Seen]:
        return [s for s in self.seen if s.method == method and fragment in s.path]

    # ------------------------------------------------------------------ routing

    def _resolve(self, repo_id: str, rev: str) -> tuple[Repo | None, str | None, str | None]:
        repo = self.repos.get(repo_id)
        if repo is None:
            return None, None, "RepoNotFound"
        if rev in (repo.branch, repo.commit):
            return repo, repo.commit, None
        return repo, None, "RevisionNotFound"

    def _handler(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # keep pytest output clean
                pass

            def do_GET(self) -> None:
                self._route("GET")

            def do_HEAD(self) -> None:
                self._route("HEAD")

            def _route(self, method: str) -> None:
                path = unquote(urlsplit(self.path).path)
                hub.seen.append(Seen(method, path, {k.lower(): v for k, v in self.headers.items()}))
                m = re.match(r"^/api/models/([^/]+/[^/]+)/(revision|tree)/([^/]+)(/.*)?$", path)
                if m:
                    return self._api(m.group(1), m.group(2), m.group(3))
                m = re.match(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", path)
                if m:
                    return self._file(method, m.group(1), m.group(2), m.group(3))
                self._error(404, "RepoNotFound")

            def _gate(self, repo: Repo | None) -> bool:
                if repo is not None and repo.gated:
                    auth = self.headers.get("Authorization", "")
                    if not hub.required_token or auth != f"Bearer {hub.required_token}":
                        self._error(401, "GatedRepo")
                        return False
                return True

            def _api(self, repo_id: str, kind: str, rev: str) -> None:
                repo, commit, err = hub._resolve(repo_id, rev)
                if err:
                    return self._error(404 if err == "RevisionNotFound" else 401, err)
                if not self._gate(repo):
                    return
                if kind == "revision":
                    body = {"id": repo_id, "sha": commit, "private": False, "gated": repo.gated,
                            "siblings": [{"rfilename": n} for n in sorted(repo.files)]}
                else:
                    body = [{"type": "file", "path": n, "size": repo.size(n),
                             "oid": hashlib.sha1(repo.files[n]).hexdigest()} for n in sorted(repo.files)]
                self._send(200, json.dumps(body).encode(), {"Content-Type": "application/json"})

            def _file(self, method: str, repo_id: str, rev: str, name: str) -> None:
                repo, commit, err = hub._resolve(repo_id, rev)
                if err:
                    return self._error(404 if err == "RevisionNotFound" else 401, err)
                if not self._gate(repo):
                    return
                if repo.refuse_files and method in repo.refuse_files[2]:
                    status, code, _ = repo.refuse_files
                    body = json.dumps({"error": "Access to this repo is restricted"}).encode()
                    headers = {"Content-Type": "application/json"} | ({"X-Error-Code": code} if code else {})
                    return self._send(status, body, headers, head=method == "HEAD")
                if name not in repo.files:
                    return self._error(404, "EntryNotFound")
                data = repo.files[name]
                headers = {"X-Repo-Commit": commit, "ETag": f'"{hashlib.sha1(data).hexdigest()}"',
                           "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
                if name.endswith(".safetensors"):  # the Hub stores these in LFS: their sha256 is the linked ETag
                    headers["X-Linked-Etag"] = f'"{hashlib.sha256(data).hexdigest()}"'
                if method == "HEAD":
                    headers["Content-Length"] = str(repo.size(name))
                    return self._send(200, b"", headers, head=True)
                start = 0
                rng = re.match(r"bytes=(\d+)-$", self.headers.get("Range", ""))
                if rng:
                    start = int(rng.group(1))
                key = f"{repo_id}/{name}"
                if key in hub.cut_once and not rng:
                    hub.cut_once.discard(key)
                    headers["Content-Length"] = str(len(data))
                    self.send_response(200)
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                if rng:
                    headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
                self._send(206 if rng else 200, data[start:], headers)

            def _error(self, code: int, error_code: str) -> None:
                body = json.dumps({"error": error_code}).encode()
                self._send(code, body, {"X-Error-Code": error_code, "Content-Type": "application/json"})

            def _send(self, code: int, body: bytes, headers: dict[str, str], head: bool = False) -> None:
                self.send_response(code)
                for k, v in headers.items():
                    self.send_header(k, v)
                if "Content-Length" not in headers:
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head:
                    self.wfile.write(body)

        return Handler
