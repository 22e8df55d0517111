"""A WebHDFS test double: just enough of the REST protocol (GETFILESTATUS, LISTSTATUS
and OPEN with the namenode -> datanode redirect) over a local directory, on 127.0.0.1
and a free port, for testing WebHDFS clients and drivers where there is no Hadoop.

It is a double, not an emulator: no writes, no permissions, no delegation tokens.
Typical use::

    with WebHdfsDouble(tmp_path) as hdfs:
        (tmp_path / "a.txt").write_bytes(b"...")
        open_store(Mount("m", f"webhdfs://{hdfs.hostport}/", {"user": "shoal"}))
"""

from __future__ import annotations

import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

PREFIX = "/webhdfs/v1"


def _status(p: Path, suffix: str) -> dict[str, object]:
    st = p.stat()
    is_dir = p.is_dir()
    return {
        "pathSuffix": suffix,
        "type": "DIRECTORY" if is_dir else "FILE",
        "length": 0 if is_dir else st.st_size,
        "modificationTime": st.st_mtime_ns // 1_000_000,
        "accessTime": 0,
        "blockSize": 134217728,
        "owner": "shoal",
        "group": "shoal",
        "permission": "755",
        "replication": 1,
    }


def _remote_exception(name: str, message: str) -> dict[str, object]:
    return {"RemoteException": {"exception": name, "message": message}}


class _Handler(BaseHTTPRequestHandler):
    base: Path

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _json(self, code: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        q = dict(urllib.parse.parse_qsl(url.query))
        if not url.path.startswith(PREFIX):
            return self._json(400, {})
        rel = urllib.parse.unquote(url.path[len(PREFIX) :]).strip("/")
        p = self.base / rel
        if not p.exists():
            return self._json(404, _remote_exception("FileNotFoundException", f"File does not exist: /{rel}"))  # fmt: skip
        op = q.get("op", "")
        if op == "GETFILESTATUS":
            return self._json(200, {"FileStatus": _status(p, "")})
        if op == "LISTSTATUS":
            items = (
                [_status(c, c.name) for c in sorted(p.iterdir())]
                if p.is_dir()
                else [_status(p, "")]
            )
            return self._json(200, {"FileStatuses": {"FileStatus": items}})
        if op == "OPEN" and "datanode" not in q:
            port = self.server.server_address[1]  # type: ignore[index]
            self.send_response(307)
            self.send_header("Location", f"http://127.0.0.1:{port}{url.path}?{url.query}&datanode=true")  # fmt: skip
            self.send_header("Content-Length", "0")
            return self.end_headers()
        if op == "OPEN":
            offset, length = int(q.get("offset", 0)), int(q.get("length", 1 << 62))
            with open(p, "rb") as f:
                f.seek(offset)
                data = f.read(length)
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return None
        return self._json(400, _remote_exception("IllegalArgumentException", f"bad op {op}"))


class WebHdfsDouble:
    """The double serving ``base`` until :meth:`close` (or the ``with`` block's end)."""

    def __init__(self, base: Path) -> None:
        self.base = base
        handler = type("Handler", (_Handler,), {"base": base})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def hostport(self) -> str:
        return f"127.0.0.1:{self._server.server_address[1]}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def __enter__(self) -> WebHdfsDouble:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
