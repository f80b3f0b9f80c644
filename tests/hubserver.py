"""A small local stand-in for the Hugging Face Hub: the endpoints huggingface_hub 2.4.0 calls for ``create_repo``,
``create_branch``, ``upload_folder`` / ``create_commit`` (README YAML check, preupload, LFS batch + basic PUT,
commit, ``create_pr``).

It binds 127.0.0.1 on a free port, serves at most ``max_requests`` requests with bodies of at most ``max_body``
bytes, and stops itself after ``lifetime`` seconds. It records every commit it accepts (files with their sha256 and
whether they came through LFS, message, PR flag, revision) so tests can assert on what a real Hub would receive.

    with serve(token="hf_TEST...") as hub:        # in-thread
        env = {"HF_ENDPOINT": hub.url, "HF_TOKEN": "hf_TEST...", "HF_HUB_DISABLE_XET": "1", "HF_HUB_OFFLINE": "0"}
        ... run the upload (a subprocess: huggingface_hub reads HF_ENDPOINT at import) ...
        hub.state.commits[-1]

``python tests/hubserver.py --token T [--lifetime 300]`` runs it in the foreground and prints its URL.
Xet storage is not implemented: clients must run with ``HF_HUB_DISABLE_XET=1`` so LFS files take the basic
LFS transfer.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import yaml

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".png", ".jpg", ".gguf", ".npz")
LFS_MIN_SIZE = 10 * 1024 * 1024
REPO_ID = r"(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)"
REPO_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass
class Repo:
    repo_id: str
    private: bool
    repo_type: str = "model"
    branches: dict[str, dict[str, dict[str, Any]]] = field(default_factory=lambda: {"main": {}})
    prs: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class HubState:
    token: str | None
    repos: dict[str, Repo] = field(default_factory=dict)
    commits: list[dict[str, Any]] = field(default_factory=list)
    lfs: dict[str, bytes] = field(default_factory=dict)
    requests: list[dict[str, Any]] = field(default_factory=list)  # method, path, status
    unhandled: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _git_blob_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class _Reply(Exception):
    def __init__(self, status: int, body: dict[str, Any], error_code: str | None = None, error_message: str | None = None):
        super().__init__(body)
        self.status, self.body, self.error_code, self.error_message = status, body, error_code, error_message


class _Handler(BaseHTTPRequestHandler):
    server: _HubHTTPServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        return

    # -- plumbing ---------------------------------------------------------------------------------------------
    def _body(self) -> bytes:
        limit = self.server.max_body
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = bytearray()
            while True:
                line = self.rfile.readline(1024)
                n = int(line.split(b";")[0].strip() or b"0", 16)
                if n == 0:
                    while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(out)
                if len(out) + n > limit:
                    raise _Reply(413, {"error": "body too large for the test hub"})
                out += self.rfile.read(n)
                self.rfile.readline(8)
        n = int(self.headers.get("Content-Length") or 0)
        if n > limit:
            raise _Reply(413, {"error": "body too large for the test hub"})
        return self.rfile.read(n) if n else b""

    def _send(self, status: int, body: dict[str, Any], error_code: str | None = None, error_message: str | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if error_code:
            self.send_header("X-Error-Code", error_code)
        if error_message:
            self.send_header("X-Error-Message", error_message)
        self.end_headers()
        self.wfile.write(data)

    def _auth(self) -> None:
        want = self.server.state.token
        if want is None:
            return
        got = self.headers.get("Authorization", "")
        if got != f"Bearer {want}":
            msg = "Invalid credentials in Authorization header"
            raise _Reply(401, {"error": msg}, error_message=msg)

    def _repo(self, repo_id: str) -> Repo:
        r = self.server.state.repos.get(repo_id)
        if r is None:
            raise _Reply(404, {"error": "Repository not found"}, error_code="RepoNotFound")
        return r

    def _dispatch(self, method: str) -> None:
        srv = self.server
        with srv.state.lock:
            srv.count += 1
            over = srv.count > srv.max_requests
        if over:
            self._send(503, {"error": "the test hub has served its maximum number of requests"})
            threading.Thread(target=srv.shutdown, daemon=True).start()
            return
        parts = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        status = 500
        try:
            body = self._body()
            status, payload = self._route(method, parts.path, query, body)
            self._send(status, payload)
        except _Reply as r:
            status = r.status
            self._send(r.status, r.body, r.error_code, r.error_message)
        except Exception as e:  # a bug in the test hub: report it to the client as a 500
            self._send(500, {"error": f"test hub error: {e.__class__.__name__}: {e}"})
        finally:
            with srv.state.lock:
                srv.state.requests.append({"method": method, "path": parts.path, "query": query, "status": status})

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    # -- endpoints --------------------------------------------------------------------------------------------
    def _route(self, method: str, path: str, query: dict[str, str], body: bytes) -> tuple[int, dict[str, Any]]:
        st = self.server.state
        base = self.server.url
        if method == "PUT" and (m := re.fullmatch(r"/lfs-upload/(?P<oid>[0-9a-f]{64})", path)):
            if hashlib.sha256(body).hexdigest() != m["oid"]:
                raise _Reply(400, {"error": "sha256 of the uploaded content does not match the oid"})
            with st.lock:
                st.lfs[m["oid"]] = body
            return 200, {}
        if method == "GET" and path == "/api/agent-harnesses":  # huggingface_hub's best-effort agent detection
            raise _Reply(404, {"error": "not served by the test hub"})
        self._auth()
        if method == "POST" and path == "/api/repos/create":
            return self._create_repo(json.loads(body or b"{}"), base)
        if method == "POST" and path == "/api/validate-yaml":
            return self._validate_yaml(json.loads(body or b"{}"))
        if method == "POST" and (m := re.fullmatch(rf"/api/models/{REPO_ID}/branch/(?P<rev>[^/]+)", path)):
            return self._create_branch(m["repo"], unquote(m["rev"]), json.loads(body or b"{}"))
        if method == "POST" and (m := re.fullmatch(rf"/api/models/{REPO_ID}/preupload/(?P<rev>[^/]+)", path)):
            return self._preupload(m["repo"], unquote(m["rev"]), json.loads(body or b"{}"), query)
        if method == "POST" and (m := re.fullmatch(rf"/{REPO_ID}\.git/info/lfs/objects/batch", path)):
            return self._lfs_batch(m["repo"], json.loads(body or b"{}"), base)
        if method == "POST" and (m := re.fullmatch(rf"/api/models/{REPO_ID}/commit/(?P<rev>[^/]+)", path)):
            return self._commit(m["repo"], unquote(m["rev"]), body, query, base)
        with st.lock:
            st.unhandled.append(f"{method} {path}")
        raise _Reply(404, {"error": f"not implemented by the test hub: {method} {path}"})

    def _create_repo(self, p: dict[str, Any], base: str) -> tuple[int, dict[str, Any]]:
        name, org = p.get("name"), p.get("organization")
        repo_id = f"{org}/{name}" if org else f"user/{name}"
        if not isinstance(name, str) or not REPO_ID_RE.match(repo_id):
            raise _Reply(400, {"error": f"invalid repo name {repo_id!r}"})
        if p.get("type", "model") not in ("model", None):
            raise _Reply(400, {"error": "the test hub serves model repos only"})
        url = f"{base}/{repo_id}"
        with self.server.state.lock:
            if repo_id in self.server.state.repos:
                raise _Reply(409, {"error": "You already created this model repo", "url": url})
            self.server.state.repos[repo_id] = Repo(repo_id, private=p.get("visibility") == "private")
        return 200, {"url": url, "name": repo_id}

    def _validate_yaml(self, p: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        content = p.get("content", "")
        errors: list[dict[str, str]] = []
        m = re.match(r"^---\n(.*?)\n---\n", content, re.S)
        if m:
            try:
                meta = yaml.safe_load(m.group(1))
            except yaml.YAMLError as e:
                meta, errors = None, [{"message": f"invalid YAML: {e}"}]
            if meta is not None and not isinstance(meta, dict):
                errors.append({"message": "metadata must be a mapping"})
            elif meta:
                bm = meta.get("base_model")
                for b in ([bm] if isinstance(bm, str) else bm or []):
                    if not isinstance(b, str) or not REPO_ID_RE.match(b):
                        errors.append({"message": f"base_model: {b!r} is not a model id"})
                for key in ("license", "library_name", "pipeline_tag"):
                    if key in meta and not isinstance(meta[key], str):
                        errors.append({"message": f"{key} must be a string"})
                tags = meta.get("tags", [])
                if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
                    errors.append({"message": "tags must be a list of strings"})
        if errors:
            return 400, {"errors": errors, "warnings": []}
        return 200, {"errors": [], "warnings": []}

    def _create_branch(self, repo_id: str, branch: str, p: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        repo = self._repo(repo_id)
        with self.server.state.lock:
            if branch in repo.branches:
                raise _Reply(409, {"error": f"branch {branch} already exists"})
            start = p.get("startingPoint") or "main"
            repo.branches[branch] = dict(repo.branches.get(start, {}))
        return 200, {}

    def _preupload(self, repo_id: str, rev: str, p: dict[str, Any], query: dict[str, str]) -> tuple[int, dict[str, Any]]:
        repo = self._repo(repo_id)
        if rev not in repo.branches:
            raise _Reply(404, {"error": f"Revision not found: {rev}"}, error_code="RevisionNotFound")
        files = []
        for f in p.get("files", []):
            lfs = f["path"].endswith(LFS_SUFFIXES) or int(f.get("size", 0)) >= LFS_MIN_SIZE
            files.append({"path": f["path"], "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False, "oid": None})
        return 200, {"files": files, "commitOid": "0" * 40}

    def _lfs_batch(self, repo_id: str, p: dict[str, Any], base: str) -> tuple[int, dict[str, Any]]:
        self._repo(repo_id)
        if p.get("operation") != "upload" or "basic" not in p.get("transfers", []):
            raise _Reply(400, {"error": "the test hub supports LFS upload with the basic transfer only"})
        objs = []
        for o in p.get("objects", []):
            entry = {"oid": o["oid"], "size": int(o["size"]), "authenticated": True}
            if o["oid"] not in self.server.state.lfs:
                entry["actions"] = {"upload": {"href": f"{base}/lfs-upload/{o['oid']}"}}
            objs.append(entry)
        return 200, {"transfer": "basic", "objects": objs}

    def _commit(self, repo_id: str, rev: str, body: bytes, query: dict[str, str], base: str) -> tuple[int, dict[str, Any]]:
        st = self.server.state
        repo = self._repo(repo_id)
        if rev not in repo.branches:
            raise _Reply(404, {"error": f"Revision not found: {rev}"}, error_code="RevisionNotFound")
        lines = [json.loads(ln) for ln in body.splitlines() if ln.strip()]
        if not lines or lines[0].get("key") != "header":
            raise _Reply(400, {"error": "the commit payload must start with a header line"})
        header = lines[0]["value"]
        files: dict[str, dict[str, Any]] = {}
        deleted: list[str] = []
        for ln in lines[1:]:
            key, v = ln.get("key"), ln.get("value", {})
            if key == "file":
                data = base64.b64decode(v["content"])
                files[v["path"]] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "lfs": False, "content": data}
            elif key == "lfsFile":
                data = st.lfs.get(v["oid"])
                if data is None:
                    raise _Reply(422, {"error": f"LFS object {v['oid']} for {v['path']} was never uploaded"})
                files[v["path"]] = {"size": len(data), "sha256": v["oid"], "lfs": True, "content": data}
            elif key in ("deletedFile", "deletedFolder"):
                deleted.append(v["path"])
            else:
                raise _Reply(400, {"error": f"unknown commit operation {key!r}"})
        create_pr = query.get("create_pr") == "1"
        oid = hashlib.sha1(body).hexdigest()
        with st.lock:
            pr_num, branch = None, rev
            if create_pr:
                pr_num = len(repo.prs) + 1
                branch = f"refs/pr/{pr_num}"
                repo.branches[branch] = dict(repo.branches[rev])
                repo.prs.append({"num": pr_num, "target": rev, "title": header.get("summary")})
            tree = repo.branches[branch]
            for d in deleted:
                for k in [k for k in tree if k == d or k.startswith(d.rstrip("/") + "/")]:
                    del tree[k]
            tree.update(files)
            st.commits.append({
                "repo_id": repo_id, "revision": rev, "branch": branch, "create_pr": create_pr, "pr_num": pr_num,
                "summary": header.get("summary"), "description": header.get("description", ""),
                "files": files, "deleted": deleted, "private": repo.private, "oid": oid,
            })
        pr_url = f"{base}/{repo_id}/discussions/{pr_num}" if create_pr else None
        return 200, {"success": True, "commitOid": oid, "commitUrl": f"{base}/{repo_id}/commit/{oid}", "pullRequestUrl": pr_url}


class _HubHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, state: HubState, max_requests: int, max_body: int):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.state, self.max_requests, self.max_body, self.count = state, max_requests, max_body, 0
        self.url = f"http://127.0.0.1:{self.server_address[1]}"


@dataclass
class Hub:
    url: str
    state: HubState
    _server: _HubHTTPServer

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@contextlib.contextmanager
def serve(token: str | None = None, *, lifetime: float = 300, max_requests: int = 2000, max_body: int = 256 << 20) -> Iterator[Hub]:
    """Run the test hub in a background thread for the duration of the block (or ``lifetime`` seconds)."""
    srv = _HubHTTPServer(HubState(token=token), max_requests, max_body)
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    timer = threading.Timer(lifetime, srv.shutdown)
    timer.daemon = True
    timer.start()
    hub = Hub(srv.url, srv.state, srv)
    try:
        yield hub
    finally:
        timer.cancel()
        srv.shutdown()
        srv.server_close()
        t.join(timeout=5)


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description="A local stand-in for the Hub's upload endpoints (127.0.0.1, free port).")
    ap.add_argument("--token", default=None, help="the only token accepted (default: any)")
    ap.add_argument("--lifetime", type=float, default=300, help="seconds before it stops itself")
    args = ap.parse_args()
    with serve(args.token, lifetime=args.lifetime) as hub:
        print(hub.url, flush=True)
        end = time.monotonic() + args.lifetime
        with contextlib.suppress(KeyboardInterrupt):
            while time.monotonic() < end:
                time.sleep(0.5)
        for c in hub.state.commits:
            print(json.dumps({k: v for k, v in c.items() if k != "files"} | {"files": sorted(c["files"])}))


if __name__ == "__main__":
    main()
