"""``disttrain report --live``: the report page over HTTP while the job runs (standard-library server,
127.0.0.1 by default). Each request re-reads the run folders and redraws when a metrics file changed; the
page reloads itself every ``refresh_s``."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from disttrain.report.page import render
from disttrain.report.plots import all_plots
from disttrain.report.runs import load_run


class LivePage:
    """The page for ``paths``, redrawn only when one of their metrics or events files changed."""

    def __init__(self, paths: list[Path], refresh_s: float) -> None:
        self.paths, self.refresh_s = paths, refresh_s
        self._key: tuple[Any, ...] | None = None
        self._page = ""
        self._lock = threading.Lock()

    def _stamp(self) -> tuple[Any, ...]:
        files = [p / name for p in self.paths for name in ("metrics.jsonl", "health/events.jsonl")]
        return tuple((f.stat().st_mtime_ns, f.stat().st_size) if f.is_file() else None for f in files)

    def html(self) -> str:
        with self._lock:  # one redraw at a time; matplotlib figures are per call, so this is only for speed
            key = self._stamp()
            if key != self._key:
                runs = [load_run(p) for p in self.paths]
                self._page, self._key = render(runs, all_plots(runs), self.refresh_s), key
            return self._page


def make_server(paths: list[Path], host: str, port: int, refresh_s: float) -> ThreadingHTTPServer:
    """A server (not started) answering ``/`` and ``/report.html`` with the live page."""
    page = LivePage(paths, refresh_s)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] not in ("/", "/report.html"):
                self.send_error(404, "the report is at /")
                return
            body = page.html().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # quiet: one line per request is noise
            pass

    return ThreadingHTTPServer((host, port), Handler)
