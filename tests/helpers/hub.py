"""A local stand-in of the Hugging Face hub: huggingface_hub talks to it through HF_ENDPOINT.

It answers what ``hf_hub_download`` asks of a dataset file, from a folder of files:
HEAD and GET on ``/datasets/<owner>/<name>/resolve/<revision>/<path>`` with the headers
the hub sends for a file kept in LFS (X-Repo-Commit, X-Linked-Etag holding the sha256,
X-Linked-Size) and HTTP range requests, which is how a partial download is resumed.
Every request is recorded. ``stall`` makes the first GET of one file send some bytes and
then hang, so a test can kill the downloading process in the middle of that file."""

from __future__ import annotations

import hashlib
import http.server
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"
_RESOLVE = re.compile(r"^/datasets/[^/]+/[^/]+/resolve/[^/]+/(?P<path>[^?]+)")


@dataclass
class Request:
    method: str
    path: str                 # the file's path in the repository
    range_start: int | None   # the first byte a range request asked for


@dataclass
class HubStandIn:
    root: Path
    requests: list[Request] = field(default_factory=list)
    stall_file: str | None = None     # the first GET of this file stalls...
    stall_after: int = 0              # ...after sending this many bytes
    stalled: threading.Event = field(default_factory=threading.Event)   # set once it has
    release: threading.Event = field(default_factory=threading.Event)
    _sha: dict[str, str] = field(default_factory=dict)

    def sha256(self, name: str) -> str:
        if name not in self._sha:
            digest = hashlib.sha256()
            with open(self.root / name, "rb") as f:
                while chunk := f.read(1 << 22):
                    digest.update(chunk)
            self._sha[name] = digest.hexdigest()
        return self._sha[name]

    def start(self) -> tuple[str, http.server.ThreadingHTTPServer]:
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:   # quiet
                pass

            def _file(self) -> str | None:
                found = _RESOLVE.match(self.path)
                if not found or not (hub.root / found["path"]).is_file():
                    self.send_error(404)
                    return None
                return found["path"]

            def _headers(self, name: str, start: int, status: int) -> int:
                size = (hub.root / name).stat().st_size
                self.send_response(status)
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("ETag", f'"{hub.sha256(name)}"')
                self.send_header("X-Linked-Etag", f'"{hub.sha256(name)}"')
                self.send_header("X-Linked-Size", str(size))
                self.send_header("Accept-Ranges", "bytes")
                if status == 206:
                    self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
                self.send_header("Content-Length", str(size - start))
                self.end_headers()
                return size

            def do_HEAD(self) -> None:
                name = self._file()
                if name is not None:
                    hub.requests.append(Request("HEAD", name, None))
                    self._headers(name, 0, 200)

            def do_GET(self) -> None:
                name = self._file()
                if name is None:
                    return
                asked = re.match(r"bytes=(\d+)-", self.headers.get("Range") or "")
                start = int(asked[1]) if asked else 0
                hub.requests.append(Request("GET", name, start if asked else None))
                self._headers(name, start, 206 if asked else 200)
                stall = name == hub.stall_file and not hub.stalled.is_set()
                sent = 0
                try:
                    with open(hub.root / name, "rb") as f:
                        f.seek(start)
                        while chunk := f.read(1 << 20):
                            if stall and sent + len(chunk) > hub.stall_after:
                                self.wfile.write(chunk[: hub.stall_after - sent])
                                self.wfile.flush()
                                hub.stalled.set()
                                hub.release.wait(300)
                                return
                            self.wfile.write(chunk)
                            sent += len(chunk)
                except (BrokenPipeError, ConnectionResetError):
                    pass   # the client was killed: what a real hub sees too

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{server.server_address[1]}", server
