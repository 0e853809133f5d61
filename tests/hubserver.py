"""A loopback fake of the Hugging Face Hub's HTTP API, enough for huggingface_hub to push and pull.

A real HTTP server on 127.0.0.1 and a free port, in a daemon thread, stopped by the fixture that
started it. Endpoints (as the installed huggingface_hub calls them):

  POST /api/repos/create                      create (409 + {"url"} when it exists)
  POST /api/validate-yaml                     README metadata check before a commit
  POST /api/models/{repo}/preupload/{rev}     answers uploadMode "regular" for every file (no LFS upload)
  POST /api/models/{repo}/commit/{rev}        NDJSON: a header line, then base64 `file` lines
  POST /api/models/{repo}/branch/{branch}     create a branch from main (409 when it exists)
  GET  /api/models/{repo}[/revision/{rev}]    model info: sha, siblings
  GET  /api/models/{repo}/tree/{rev}[/path]   the file listing (lfs sha256 for *.safetensors, as the Hub)
  HEAD/GET /{repo}/resolve/{rev}/{path}       the bytes, with ETag, X-Repo-Commit (X-Linked-* for LFS)

`fail()` injects an error answer for the next matching request; `stall()` makes it hang (no answer
until release() or stop()) and `drop()` close the connection unanswered; `corrupt` names paths whose
bytes a commit stores with one byte changed (the Hub holding other bytes than were sent).

Why a real socket: huggingface_hub talks httpx (httpx2 in 2.x), so request mocks made for `requests`
would not intercept it. Every new repo starts with a .gitattributes commit, as on the Hub; writes
need `Authorization: Bearer <token>` when the hub is given a token, and fail() can echo the request's
Authorization header in its error (as a careless server might), to test that clients never show it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

GITATTRIBUTES = b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"
STALL, DROP = -1, -2  # Failure.status values: no answer at all


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\x00" % len(data) + data).hexdigest()


def is_lfs(path: str) -> bool:
    return path.endswith(".safetensors")


@dataclass
class Commit:
    oid: str
    files: dict[str, bytes]
    parent: str | None
    message: str


@dataclass
class Repo:
    repo_id: str
    private: bool
    branches: dict[str, str] = field(default_factory=dict)
    commits: dict[str, Commit] = field(default_factory=dict)


@dataclass
class Failure:
    method: str
    kind: str  # create | validate | preupload | commit | branch | info | tree | resolve
    status: int
    message: str
    echo_auth: bool
    error_code: str | None


class FakeHub:
    def __init__(self, token: str | None = None):
        self.token = token
        self.repos: dict[str, Repo] = {}
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Authorization header)
        self.failures: list[Failure] = []
        self.corrupt: set[str] = set()
        self.released = threading.Event()  # set: stalled requests end (their connection closed unanswered)
        self.lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> "FakeHub":
        hub = self

        class Handler(_Handler):
            pass

        Handler.hub = hub
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-hub", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self.released.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=10)
            self._server = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    # -- state ---------------------------------------------------------------------------
    def fail(
        self,
        method: str,
        kind: str,
        status: int,
        message: str = "injected failure",
        *,
        echo_auth: bool = False,
        error_code: str | None = None,
    ) -> None:
        """The next `method` request of this kind gets `status` with {"error": message}."""
        with self.lock:
            self.failures.append(Failure(method, kind, status, message, echo_auth, error_code))

    def stall(self, method: str, kind: str) -> None:
        """The next `method` request of this kind is read and never answered (until release())."""
        self.fail(method, kind, STALL)

    def drop(self, method: str, kind: str) -> None:
        """The next `method` request of this kind is read and its connection closed, unanswered."""
        self.fail(method, kind, DROP)

    def release(self) -> None:
        self.released.set()

    def create(self, repo_id: str, private: bool = False) -> Repo:
        repo = Repo(repo_id, private)
        self.repos[repo_id] = repo
        self.commit(repo_id, "main", {".gitattributes": GITATTRIBUTES}, "initial commit")
        return repo

    def commit(self, repo_id: str, branch: str, files: dict[str, bytes], message: str, deleted=()) -> Commit:
        repo = self.repos[repo_id]
        parent = repo.branches.get(branch)
        tree = dict(repo.commits[parent].files) if parent else {}
        tree.update(files)
        for p in deleted:
            tree.pop(p, None)
        h = hashlib.sha1(f"{parent}\n{message}\n{len(repo.commits)}".encode())
        for p in sorted(tree):
            h.update(p.encode() + b"\0" + hashlib.sha256(tree[p]).digest())
        c = Commit(h.hexdigest(), tree, parent, message)
        repo.commits[c.oid] = c
        repo.branches[branch] = c.oid
        return c

    def resolve(self, repo_id: str, rev: str) -> Commit | None:
        repo = self.repos.get(repo_id)
        if repo is None:
            return None
        oid = repo.branches.get(rev, rev)
        return repo.commits.get(oid)

    def files(self, repo_id: str, rev: str = "main") -> dict[str, bytes]:
        return dict(self.resolve(repo_id, rev).files)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    hub: FakeHub

    def log_message(self, format, *args):  # noqa: A002 (the base class's name)
        pass

    # -- plumbing ------------------------------------------------------------------------
    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = b""
            while True:
                size = int(self.rfile.readline().strip(), 16)
                if size == 0:
                    self.rfile.readline()
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _send(self, status: int, body: bytes = b"", headers: dict | None = None, head: bool = False) -> None:
        self.send_response(status)
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        for k, v in hdrs.items():
            self.send_header(k, v)
        if "Content-Length" not in hdrs:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head and body:
            self.wfile.write(body)

    def _json(self, status: int, obj, headers: dict | None = None) -> None:
        self._send(status, json.dumps(obj).encode(), headers)

    def _error(self, status: int, message: str, code: str | None = None) -> None:
        self._json(
            status,
            {"error": message},
            {"X-Error-Code": code, "X-Error-Message": message} if code else {"X-Error-Message": message},
        )

    def _authorized(self) -> bool:
        hub = self.hub
        return hub.token is None or self.headers.get("Authorization") == f"Bearer {hub.token}"

    def _injected(self, method: str, kind: str) -> bool:
        hub = self.hub
        with hub.lock:
            for i, f in enumerate(hub.failures):
                if f.method == method and f.kind == kind:
                    del hub.failures[i]
                    break
            else:
                return False
        if f.status in (STALL, DROP):
            if f.status == STALL:
                hub.released.wait(120)
            self.close_connection = True
            return True
        msg = f.message + (f" (request had Authorization: {self.headers.get('Authorization')})" if f.echo_auth else "")
        if method == "HEAD":
            self._send(f.status, headers={"X-Error-Message": msg}, head=True)
        else:
            self._error(f.status, msg, f.error_code)
        return True

    def _route(self, method: str) -> None:
        hub = self.hub
        parts = urlsplit(self.path)
        path, query = unquote(parts.path), parse_qs(parts.query)
        hub.requests.append((method, path, self.headers.get("Authorization")))
        body = self._body() if method in ("POST", "PUT") else b""
        seg = parts.path.strip("/").split("/")
        if path == "/api/repos/create" and method == "POST":
            return self._create(json.loads(body or b"{}"))
        if path == "/api/validate-yaml" and method == "POST":
            if self._injected(method, "validate"):
                return
            return self._json(200, {"errors": [], "warnings": []})
        if len(seg) >= 4 and seg[0] == "api" and seg[1] == "models":
            repo_id = f"{unquote(seg[2])}/{unquote(seg[3])}"
            rest = [unquote(s) for s in seg[4:]]
            if method == "POST" and len(rest) == 2 and rest[0] in ("preupload", "commit", "branch"):
                return getattr(self, "_" + rest[0])(repo_id, rest[1], body)
            if method == "GET" and (not rest or (len(rest) == 2 and rest[0] == "revision")):
                return self._info(repo_id, rest[1] if rest else "main")
            if method == "GET" and len(rest) >= 2 and rest[0] == "tree":
                return self._tree(repo_id, rest[1], "/".join(rest[2:]), query)
        if method in ("GET", "HEAD") and len(seg) >= 5 and seg[2] == "resolve":
            repo_id = f"{unquote(seg[0])}/{unquote(seg[1])}"
            return self._resolve(method, repo_id, unquote(seg[3]), "/".join(unquote(s) for s in seg[4:]))
        self._error(404, f"no route for {method} {path}")

    def do_GET(self):  # noqa: N802 (http.server's names)
        self._route("GET")

    def do_HEAD(self):  # noqa: N802
        self._route("HEAD")

    def do_POST(self):  # noqa: N802
        self._route("POST")

    # -- endpoints -----------------------------------------------------------------------
    def _repo_for_read(self, repo_id: str):
        repo = self.hub.repos.get(repo_id)
        if repo is None or (repo.private and not self._authorized()):
            self._error(404, "Repository not found", "RepoNotFound")
            return None
        return repo

    def _create(self, payload: dict) -> None:
        hub = self.hub
        if self._injected("POST", "create"):
            return
        if not self._authorized():
            return self._error(401, "Invalid credentials in Authorization header")
        repo_id = f"{payload.get('organization')}/{payload.get('name')}"
        url = f"{hub.url}/{repo_id}"
        with hub.lock:
            if repo_id in hub.repos:
                return self._json(409, {"error": "You already created this model repo", "url": url})
            private = payload.get("private") is True or payload.get("visibility") == "private"
            hub.create(repo_id, private=private)
        self._json(200, {"url": url, "name": repo_id})

    def _preupload(self, repo_id: str, rev: str, body: bytes) -> None:
        hub = self.hub
        if self._injected("POST", "preupload"):
            return
        if not self._authorized():
            return self._error(401, "Invalid credentials in Authorization header")
        head = hub.resolve(repo_id, rev)
        if head is None:
            return self._error(404, "Repository not found", "RepoNotFound")
        files = json.loads(body)["files"]
        self._json(
            200,
            {
                "files": [
                    {
                        "path": f["path"],
                        "uploadMode": "regular",
                        "shouldIgnore": False,
                        "oid": git_blob_sha1(head.files[f["path"]]) if f["path"] in head.files else None,
                    }
                    for f in files
                ]
            },
        )

    def _commit(self, repo_id: str, rev: str, body: bytes) -> None:
        hub = self.hub
        if self._injected("POST", "commit"):
            return
        if not self._authorized():
            return self._error(401, "Invalid credentials in Authorization header")
        if repo_id not in hub.repos:
            return self._error(404, "Repository not found", "RepoNotFound")
        if rev not in hub.repos[repo_id].branches:
            return self._error(404, f"Invalid rev id: {rev}", "RevisionNotFound")
        lines = [json.loads(x) for x in body.decode().splitlines() if x.strip()]
        if not lines or lines[0]["key"] != "header":
            return self._error(400, "the first NDJSON line must be the header")
        files, deleted = {}, []
        for item in lines[1:]:
            v = item["value"]
            if item["key"] == "file" and v.get("encoding") == "base64":
                files[v["path"]] = base64.b64decode(v["content"])
                if v["path"] in hub.corrupt and files[v["path"]]:  # stored other than sent
                    files[v["path"]] = bytes([files[v["path"]][0] ^ 1]) + files[v["path"]][1:]
            elif item["key"] in ("deletedFile", "deletedFolder"):
                deleted.append(v["path"])
            else:
                return self._error(
                    400, f"unsupported commit operation {item['key']!r} (this fake takes regular files only)"
                )
        with hub.lock:
            c = hub.commit(repo_id, rev, files, lines[0]["value"].get("summary", ""), deleted)
        self._json(
            200,
            {
                "success": True,
                "commitOid": c.oid,
                "commitUrl": f"{hub.url}/{repo_id}/commit/{c.oid}",
                "pullRequestUrl": None,
            },
        )

    def _branch(self, repo_id: str, branch: str, body: bytes) -> None:
        hub = self.hub
        if self._injected("POST", "branch"):
            return
        if not self._authorized():
            return self._error(401, "Invalid credentials in Authorization header")
        repo = hub.repos.get(repo_id)
        if repo is None:
            return self._error(404, "Repository not found", "RepoNotFound")
        if branch in repo.branches:
            return self._error(409, "Reference already exists")
        start = (json.loads(body or b"{}") or {}).get("startingPoint") or "main"
        with hub.lock:
            repo.branches[branch] = repo.branches.get(start, start)
        self._json(200, {})

    def _info(self, repo_id: str, rev: str) -> None:
        if self._injected("GET", "info"):
            return
        repo = self._repo_for_read(repo_id)
        if repo is None:
            return
        c = self.hub.resolve(repo_id, rev)
        if c is None:
            return self._error(404, f"Invalid rev id: {rev}", "RevisionNotFound")
        self._json(
            200,
            {
                "_id": repo_id,
                "id": repo_id,
                "modelId": repo_id,
                "sha": c.oid,
                "private": repo.private,
                "disabled": False,
                "gated": False,
                "tags": [],
                "downloads": 0,
                "likes": 0,
                "lastModified": "2025-01-01T00:00:00.000Z",
                "createdAt": "2025-01-01T00:00:00.000Z",
                "siblings": [{"rfilename": p} for p in sorted(c.files)],
            },
        )

    def _tree(self, repo_id: str, rev: str, under: str, query) -> None:
        if self._injected("GET", "tree"):
            return
        if self._repo_for_read(repo_id) is None:
            return
        c = self.hub.resolve(repo_id, rev)
        if c is None:
            return self._error(404, f"Invalid rev id: {rev}", "RevisionNotFound")
        recursive = query.get("recursive", ["false"])[0].lower() == "true"
        prefix = under.strip("/") + "/" if under.strip("/") else ""
        entries, dirs = [], set()
        for p in sorted(c.files):
            if not p.startswith(prefix):
                continue
            rest = p[len(prefix) :]
            if "/" in rest and not recursive:
                dirs.add(prefix + rest.split("/")[0])
                continue
            for i in range(rest.count("/")):
                dirs.add(prefix + "/".join(rest.split("/")[: i + 1]))
            data = c.files[p]
            e = {"type": "file", "oid": git_blob_sha1(data), "size": len(data), "path": p}
            if is_lfs(p):
                e["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
            entries.append(e)
        entries += [{"type": "directory", "oid": "0" * 40, "size": 0, "path": d} for d in sorted(dirs)]
        self._json(200, entries)

    def _resolve(self, method: str, repo_id: str, rev: str, path: str) -> None:
        if self._injected(method, "resolve"):
            return
        if self._repo_for_read(repo_id) is None:
            return
        c = self.hub.resolve(repo_id, rev)
        if c is None:
            return self._error(404, f"Invalid rev id: {rev}", "RevisionNotFound")
        if path not in c.files:
            return self._error(404, "Entry not found", "EntryNotFound")
        data = c.files[path]
        headers = {
            "Content-Type": "application/octet-stream",
            "X-Repo-Commit": c.oid,
            "Accept-Ranges": "bytes",
            "ETag": f'"{git_blob_sha1(data)}"',
        }
        if is_lfs(path):
            sha = hashlib.sha256(data).hexdigest()
            headers.update({"ETag": f'"{sha}"', "X-Linked-Etag": f'"{sha}"', "X-Linked-Size": str(len(data))})
        rng = self.headers.get("Range")
        status = 200
        if rng and rng.startswith("bytes="):
            start = int(rng[6:].split("-")[0] or 0)
            data, status = data[start:], 206
            headers["Content-Range"] = f"bytes {start}-{start + len(data) - 1}/{len(c.files[path])}"
        headers["Content-Length"] = str(len(data))
        self._send(status, data, headers, head=(method == "HEAD"))
