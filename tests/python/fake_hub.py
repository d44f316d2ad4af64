"""A Hugging Face Hub on loopback, for the download tests: the resolve
endpoint as the Hub answers it (X-Repo-Commit, ETag or X-Linked-Etag and
X-Linked-Size, X-Error-Code on 404s), large ("LFS") files redirected to a
CDN on another port, which serves Range requests. Faults on request: the
CDN can cut the first transfer of each file half-way, ignore Range, or
announce more bytes than it holds. Every request is logged."""
import hashlib
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit


def git_blob_sha1(data):
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # a connection per request: none outlives the server

    def log_message(self, *a):
        pass


class Repo:
    def __init__(self, files, lfs=(), commit=None, branch="main"):
        self.files = dict(files)
        self.lfs = set(lfs)
        self.commit = commit or hashlib.sha1(repr(sorted(self.files)).encode()).hexdigest()
        self.branch = branch


class FakeHub:
    def __init__(self):
        self.repos = {}
        self.log = []  # (server, method, path, headers)
        self.cut_first = False  # the CDN drops the first GET of each blob half-way
        self.ignore_range = False
        self.short = set()  # sha256s the CDN serves one byte short of the announced size
        self.cdn_hop = False  # the CDN redirects /cdn/<sha> once more, to /signed/<sha>
        self._cut_done = set()
        self._lock = threading.Lock()
        self.hub = self._serve(self._hub_handler())
        self.cdn = self._serve(self._cdn_handler())
        self.endpoint = f"http://127.0.0.1:{self.hub.server_port}"

    # ---- servers ----
    def _serve(self, handler):
        srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        srv.daemon_threads = True
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        return srv

    def close(self):
        for s in (self.hub, self.cdn):
            s.shutdown()
            s.server_close()

    def _record(self, server, req):
        with self._lock:
            self.log.append((server, req.command, req.path, {k.lower(): v for k, v in req.headers.items()}))

    def requests(self, server=None):
        with self._lock:
            return [r for r in self.log if server is None or r[0] == server]

    def blob(self, sha):
        for repo in self.repos.values():
            for name, data in repo.files.items():
                if name in repo.lfs and hashlib.sha256(data).hexdigest() == sha:
                    return data
        return None

    def _hub_handler(hub):
        class H(_Handler):
            def _send(self, code, headers, body=b""):
                self.send_response(code)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)) if "Content-Length" not in headers else
                                 headers["Content-Length"])
                self.end_headers()
                if self.command == "GET" and body:
                    self.wfile.write(body)

            def _resolve(self):
                hub._record("hub", self)
                parts = urlsplit(self.path).path.split("/")
                # /org/name/resolve/<rev>/<path...>
                if len(parts) < 6 or parts[3] != "resolve":
                    return self._send(404, {"X-Error-Code": "EntryNotFound"})
                repo_id, rev, name = f"{parts[1]}/{parts[2]}", unquote(parts[4]), unquote("/".join(parts[5:]))
                repo = hub.repos.get(repo_id)
                if repo is None:
                    return self._send(401, {"X-Error-Code": "RepoNotFound",
                                            "X-Error-Message": "Repository not found"})
                if rev not in (repo.branch, repo.commit):
                    return self._send(404, {"X-Error-Code": "RevisionNotFound"})
                base = {"X-Repo-Commit": repo.commit}
                if name not in repo.files:
                    return self._send(404, dict(base, **{"X-Error-Code": "EntryNotFound"}))
                data = repo.files[name]
                if name in repo.lfs:
                    sha = hashlib.sha256(data).hexdigest()
                    loc = f"http://127.0.0.1:{hub.cdn.server_port}/cdn/{sha}?sig=abc"
                    return self._send(302, dict(base, **{"Location": loc, "X-Linked-Etag": f'"{sha}"',
                                                         "X-Linked-Size": str(len(data)),
                                                         "ETag": f'"{git_blob_sha1(b"pointer")}"'}))
                return self._send(200, dict(base, ETag=f'"{git_blob_sha1(data)}"'), data)

            do_HEAD = do_GET = _resolve
        return H

    def _cdn_handler(hub):
        class C(_Handler):
            def do_GET(self):
                hub._record("cdn", self)
                path = urlsplit(self.path).path
                sha = path.rsplit("/", 1)[-1]
                if hub.cdn_hop and path.startswith("/cdn/"):
                    self.send_response(302)
                    self.send_header("Location", f"/signed/{sha}?exp=1")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                data = hub.blob(sha)
                if data is None:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                start = 0
                rng = self.headers.get("Range")
                if rng and not hub.ignore_range and rng.startswith("bytes=") and rng.endswith("-"):
                    start = int(rng[6:-1])
                body = data[start:]
                if sha in hub.short:  # a whole response, one byte short of the Hub's X-Linked-Size
                    body = body[:-1]
                self.send_response(206 if start else 200)
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                with hub._lock:
                    cut = hub.cut_first and sha not in hub._cut_done
                    if cut:
                        hub._cut_done.add(sha)
                if cut:
                    self.wfile.write(body[:len(body) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                self.wfile.write(body)
        return C
