"""A local stand-in for the Hugging Face Hub's HTTP endpoints, for tests only: the real Hub cannot be reached
from the test machine, so `huggingface_hub` is pointed here (HF_ENDPOINT / `endpoint=`) and every call is
recorded. It implements what publishing and fetching a model use, as huggingface_hub 2.4 speaks them:

    POST /api/repos/create                      create a repo (409 if it exists)
    POST /api/validate-yaml                     model-card metadata check
    POST /api/models/{repo}/preupload/{rev}     answers "regular" for every file (contents go in the commit)
    POST /api/models/{repo}/commit/{rev}        NDJSON commit: header + base64 files -> a new commit sha
    GET  /api/{models,datasets}/{repo}[/revision/{rev}]   repo info: sha and file list
    GET  /api/{models,datasets}/{repo}/tree/{rev}         the file list snapshot_download walks
    HEAD/GET /{repo}/resolve/{rev}/{path}       file download (datasets under /datasets/{repo}/...)

Requests must carry `Authorization: Bearer <token>` with the token it was started with, which may do anything
(the deployment's token, say), or one of `grants`' tokens, which may read and write only the namespaces granted
to it (an organisation's own token). A repo seeded with `private=False` is readable by anyone, without a token;
a private repo answers an anonymous request 401 and a token without access 404, both `RepoNotFound`, as the
Hub does. `calls` records each request's Authorization header, so a test can show which token was sent where.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit


@dataclass
class Repo:
    kind: str
    private: bool
    commits: list[tuple[str, dict[str, bytes]]] = field(default_factory=list)  # (sha, files at that commit)

    def files_at(self, revision: str) -> tuple[str, dict[str, bytes]] | None:
        if not self.commits:
            return None
        if revision in ("main", ""):
            return self.commits[-1]
        return next(((sha, files) for sha, files in self.commits if sha == revision), None)


class HubStandIn:
    def __init__(self, token: str, grants: dict[str, set[str]] | None = None):
        self.token = token
        self.grants = {other: set(namespaces) for other, namespaces in (grants or {}).items()}
        self.repos: dict[str, Repo] = {}
        self.calls: list[tuple[str, str, str | None]] = []  # (method, path, Authorization header)
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> HubStandIn:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def put_files(self, repo_id: str, files: dict[str, bytes], kind: str = "model", private: bool = True) -> str:
        """Seed a repo directly (as if someone had pushed it); returns the commit sha."""
        repo = self.repos.setdefault(f"{kind}/{repo_id}", Repo(kind, private=private))
        return self._commit(repo, files)

    def tokens_sent(self, fragment: str) -> set[str | None]:
        """The Authorization headers of every request whose path contains `fragment` (a repo id, say)."""
        with self._lock:
            return {header for _, path, header in self.calls if fragment in path}

    def _commit(self, repo: Repo, changes: dict[str, bytes]) -> str:
        previous = dict(repo.commits[-1][1]) if repo.commits else {}
        previous.update(changes)
        digest = hashlib.sha1(json.dumps(sorted((k, hashlib.sha256(v).hexdigest()) for k, v in previous.items()))
                              .encode() + str(len(repo.commits)).encode()).hexdigest()
        repo.commits.append((digest, previous))
        return digest

    def _handler(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def _reply(self, status: int, body: bytes | dict = b"", headers: dict | None = None,
                       head: bool = False) -> None:
                data = json.dumps(body).encode() if isinstance(body, dict) else body
                self.send_response(status)
                if isinstance(body, dict):
                    self.send_header("Content-Type", "application/json")
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if not head:
                    self.wfile.write(data)

            def _authorised(self, kind: str | None = None, repo_id: str | None = None, write: bool = False,
                            head: bool = False) -> bool:
                """Whether this request's token may do this to `kind/repo_id` (None: no repo, any valid token)."""
                header = self.headers.get("Authorization")
                with hub._lock:
                    hub.calls.append((self.command, urlsplit(self.path).path, header))
                token = header.removeprefix("Bearer ") if header and header.startswith("Bearer ") else None
                if header is not None and token != hub.token and token not in hub.grants:
                    self._reply(401, {"error": "Invalid credentials in Authorization header"}, head=head)
                    return False
                if token == hub.token:
                    return True
                namespace, slash, _ = (repo_id or "").partition("/")
                if token is not None and slash and namespace in hub.grants[token]:
                    return True
                repo = hub.repos.get(f"{kind}/{repo_id}") if repo_id else None
                if repo_id and not write and (repo is None or not repo.private):
                    return True  # public (or absent: answered 404 by the route)
                if repo_id is None and token is not None:
                    return True
                if token is not None and write:
                    self._reply(403, {"error": f"You don't have the rights to write to {repo_id}"}, head=head)
                else:
                    self._reply(401 if token is None else 404, {"error": "Repository Not Found"},
                                {"X-Error-Code": "RepoNotFound"}, head=head)
                return False

            def _body(self) -> bytes:
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def do_POST(self) -> None:  # noqa: N802
                path = unquote(urlsplit(self.path).path)
                body = self._body()
                if path == "/api/repos/create":
                    request = json.loads(body)
                    kind = request.get("type") or "model"
                    repo_id = f"{request['organization']}/{request['name']}"
                    if not self._authorised(kind, repo_id, write=True):
                        return
                    key = f"{kind}/{repo_id}"
                    if key in hub.repos:
                        return self._reply(409, {"error": "You already created this model repo",
                                                 "url": f"{hub.url}/{repo_id}"})
                    hub.repos[key] = Repo(kind, private=request.get("visibility") == "private"
                                          or bool(request.get("private")))
                    return self._reply(200, {"url": f"{hub.url}/{repo_id}", "name": repo_id})
                if path == "/api/validate-yaml":
                    if not self._authorised():
                        return
                    return self._reply(200, {"errors": [], "warnings": []})
                match = re.fullmatch(r"/api/(models|datasets)/([^/]+/[^/]+)/(preupload|commit)/(.+)", path)
                if match is None:
                    return self._reply(404, {"error": f"no route {path}"})
                plural, repo_id, action, _revision = match.groups()
                if not self._authorised(plural[:-1], repo_id, write=True):
                    return
                repo = hub.repos.get(f"{plural[:-1]}/{repo_id}")
                if repo is None:
                    return self._reply(404, {"error": "Repository not found"},
                                       {"X-Error-Code": "RepoNotFound"})
                if action == "preupload":
                    files = json.loads(body)["files"]
                    return self._reply(200, {"files": [{"path": f["path"], "uploadMode": "regular",
                                                        "shouldIgnore": False, "oid": None} for f in files]})
                changes = {}
                for line in body.splitlines():
                    item = json.loads(line)
                    if item["key"] == "file":
                        changes[item["value"]["path"]] = base64.b64decode(item["value"]["content"])
                with hub._lock:
                    sha = hub._commit(repo, changes)
                return self._reply(200, {"commitUrl": f"{hub.url}/{repo_id}/commit/{sha}", "commitOid": sha})

            def do_GET(self) -> None:  # noqa: N802
                self._get(head=False)

            def do_HEAD(self) -> None:  # noqa: N802
                self._get(head=True)

            def _get(self, head: bool) -> None:
                path = unquote(urlsplit(self.path).path)
                info = re.fullmatch(r"/api/(models|datasets)/([^/]+/[^/]+)(?:/revision/(.+))?", path)
                tree = re.fullmatch(r"/api/(models|datasets)/([^/]+/[^/]+)/tree/([^/]+)", path)
                resolve = re.fullmatch(r"/(datasets/)?([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
                if tree or info:
                    kind, repo_id = (tree or info).group(1)[:-1], (tree or info).group(2)
                elif resolve:
                    kind, repo_id = "dataset" if resolve.group(1) else "model", resolve.group(2)
                else:
                    kind = repo_id = None
                if not self._authorised(kind, repo_id, head=head):
                    return
                if info and not tree:
                    plural, repo_id, revision = info.groups()
                    repo = hub.repos.get(f"{plural[:-1]}/{repo_id}")
                    found = repo.files_at(revision or "main") if repo else None
                    if found is None:
                        return self._reply(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"},
                                           head=head)
                    sha, files = found
                    return self._reply(200, {"id": repo_id, "sha": sha, "private": repo.private,
                                             "siblings": [{"rfilename": name} for name in sorted(files)]}, head=head)
                if tree:
                    plural, repo_id, revision = tree.groups()
                    repo = hub.repos.get(f"{plural[:-1]}/{repo_id}")
                    found = repo.files_at(revision) if repo else None
                    if found is None:
                        return self._reply(404, {"error": "Revision not found"}, {"X-Error-Code": "RevisionNotFound"},
                                           head=head)
                    entries = [{"type": "file", "path": name, "size": len(data),
                                "oid": hashlib.sha1(data).hexdigest()} for name, data in sorted(found[1].items())]
                    return self._reply(200, json.dumps(entries).encode(), {"Content-Type": "application/json"},
                                       head=head)
                if resolve:
                    dataset, repo_id, revision, name = resolve.groups()
                    repo = hub.repos.get(f"{'dataset' if dataset else 'model'}/{repo_id}")
                    found = repo.files_at(revision) if repo else None
                    if found is None or name not in found[1]:
                        return self._reply(404, {"error": "Entry not found"}, {"X-Error-Code": "EntryNotFound"},
                                           head=head)
                    sha, files = found
                    data = files[name]
                    return self._reply(200, data, {"ETag": f'"{hashlib.sha256(data).hexdigest()}"',
                                                   "X-Repo-Commit": sha}, head=head)
                return self._reply(404, {"error": f"no route {path}"}, head=head)

        return Handler
