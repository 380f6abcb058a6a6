"""A web site and a git server on 127.0.0.1 for the fetch tests: nothing leaves the machine.

``Site`` serves the files of a folder over HTTP and every bare repository under it over git's smart
HTTP protocol (``git http-backend`` run as a CGI per request, as a web server runs it), so a shallow
clone at a tag goes over the same wire as one from a forge. ``redirects`` maps a path to a Location,
``types`` gives a path its Content-Type (by default, by the file's suffix), and every request's path is
recorded. ``make_repo`` builds a repository with a tag and a later
commit, so a test can tell which one was cloned."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Self
from urllib.parse import unquote, urlsplit

GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@t",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@t",
    "GIT_CONFIG_NOSYSTEM": "1",
}
GIT_SERVICES = ("/info/refs", "/git-upload-pack", "/git-receive-pack", "/HEAD", "/objects/")


def git(*args: str, cwd: Path) -> str:
    env = {**os.environ, **GIT_IDENTITY, "HOME": str(cwd)}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


def make_repo(served: Path, name: str, tagged: dict[str, str], later: dict[str, str], tag: str = "v1") -> Path:
    """A bare repository ``served/name``: ``tagged`` files committed and tagged ``tag``, then ``later``
    committed on main over them. Returns its folder."""
    work = served.parent / f"{name}-work"
    work.mkdir()
    git("init", "-q", "-b", "main", cwd=work)
    for files, message in ((tagged, "tagged"), (later, "later")):
        for rel, text in files.items():
            (work / rel).parent.mkdir(parents=True, exist_ok=True)
            (work / rel).write_text(text)
        git("add", "-A", cwd=work)
        git("commit", "-q", "-m", message, cwd=work)
        if message == "tagged":
            git("tag", tag, cwd=work)
    bare = served / name
    git("clone", "-q", "--bare", str(work), str(bare), cwd=served.parent)
    shutil.rmtree(work)
    return bare


class Site:
    """Serves ``folder`` while in ``with``: ``url(path)`` is where a file (or a repository) is."""

    def __init__(
        self,
        folder: Path,
        redirects: dict[str, str] | None = None,
        types: dict[str, str] | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self.folder = folder
        self.redirects = redirects or {}
        self.types = types or {}
        self.requests: list[str] = []
        self._server = ThreadingHTTPServer((host, 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}/{path.lstrip('/')}"

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        site = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                return

            def do_GET(self) -> None:
                site.requests.append(self.path)
                path = urlsplit(self.path).path
                if path in site.redirects:
                    self.send_response(302)
                    self.send_header("Location", site.redirects[path])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                elif ".git/" in path and any(s in path for s in GIT_SERVICES):
                    self._git()
                else:
                    self._file(path)

            def do_POST(self) -> None:
                site.requests.append(self.path)
                self._git()

            def _file(self, path: str) -> None:
                target = (site.folder / unquote(path).lstrip("/")).resolve()
                if not target.is_relative_to(site.folder.resolve()) or not target.is_file():
                    self.send_error(404)
                    return
                data = target.read_bytes()
                kinds = {".html": "text/html; charset=utf-8", ".pdf": "application/pdf", ".txt": "text/plain"}
                self.send_response(200)
                kind = site.types.get(path) or kinds.get(target.suffix, "application/octet-stream")
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _git(self) -> None:
                """One request through ``git http-backend``, as a CGI (RFC 3875)."""
                parts = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                env = {
                    "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                    "GIT_PROJECT_ROOT": str(site.folder),
                    "GIT_HTTP_EXPORT_ALL": "1",
                    "GIT_CONFIG_NOSYSTEM": "1",
                    "HOME": str(site.folder),
                    "REQUEST_METHOD": self.command,
                    "PATH_INFO": unquote(parts.path),
                    "QUERY_STRING": parts.query,
                    "CONTENT_TYPE": self.headers.get("Content-Type", ""),
                    "CONTENT_LENGTH": str(len(body)),
                    "REMOTE_ADDR": self.client_address[0],
                    "SERVER_PROTOCOL": "HTTP/1.0",
                    "GATEWAY_INTERFACE": "CGI/1.1",
                }
                for name, value in self.headers.items():
                    env["HTTP_" + name.upper().replace("-", "_")] = value
                done = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True, check=False)
                head, _, payload = done.stdout.partition(b"\r\n\r\n")
                if not _:
                    head, _, payload = done.stdout.partition(b"\n\n")
                status, headers = 200, []
                for line in head.decode("latin-1").splitlines():
                    name, _colon, value = line.partition(":")
                    if name.lower() == "status":
                        status = int(value.split()[0])
                    elif name:
                        headers.append((name, value.strip()))
                self.send_response(status)
                for name, value in headers:
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        return Handler


# The scripted model's one step in the fetch tests: every source's name, then the codes the context holds.
REPORT = (
    "import re\n"
    "SUBMIT(' | '.join(s['name'] for s in sources) + ' || ' + ' '.join(re.findall(r'\\b[A-Z]{2,6}-\\d+', context)))"
)


@contextmanager
def page_and_repo(tmp_path: Path, page: bytes) -> Iterator[Site]:
    """A site serving ``page.html`` and ``repo.git`` (tag v1 says TAG-1, the later commit MAIN-2)."""
    served = tmp_path / "served"
    served.mkdir()
    (served / "page.html").write_bytes(page)
    make_repo(served, "repo.git", tagged={"NOTES.md": "tag code TAG-1\n"}, later={"NOTES.md": "main code MAIN-2\n"})
    with Site(served) as site:
        yield site
