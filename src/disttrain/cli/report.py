"""``disttrain report RUN [RUN ...]``: plots and one self-contained HTML page, or ``--live`` over HTTP."""

from __future__ import annotations

import argparse
import sys
import webbrowser
from pathlib import Path


def main(argv: list[str]) -> int:
    from disttrain.errors import ConfigError

    p = argparse.ArgumentParser(prog="disttrain report", description="Plots and an HTML page for run folders.")
    p.add_argument("runs", nargs="+", type=Path, help="run folders (runs/NAME); several: curves overlaid")
    where = "where report.html and plots/ go (default: RUN/report; several runs: ./report)"
    p.add_argument("-o", "--out", type=Path, default=None, help=where)
    p.add_argument("--open", action="store_true", help="open the page in the default browser")
    p.add_argument("--live", action="store_true", help="serve the page over HTTP, refreshing while the job runs")
    p.add_argument("--host", default="127.0.0.1", help="--live: address to bind (default: this machine only)")
    p.add_argument("--port", type=int, default=8008, help="--live: port (0: any free one)")
    p.add_argument("--refresh-s", type=float, default=5.0, help="--live: how often the page reloads")
    a = p.parse_args(argv)
    from disttrain.report import load_run, write_report

    if a.refresh_s <= 0:
        raise ConfigError(f"--refresh-s must be > 0, got {a.refresh_s}")
    runs = [load_run(r) for r in a.runs]  # a clear error for a folder that is not a run, before serving
    if a.live:
        return serve(a.runs, a.host, a.port, a.refresh_s, a.open)
    out = a.out or (a.runs[0] / "report" if len(a.runs) == 1 else Path("report"))
    page = write_report(runs, out)
    for run in runs:
        for w in run.warnings:
            print(f"disttrain report: warning: {run.name}: {w}", file=sys.stderr)
    print(f"wrote {page} and {out / 'plots'}/")
    if a.open:
        webbrowser.open(page.resolve().as_uri())
    return 0


def serve(paths: list[Path], host: str, port: int, refresh_s: float, open_page: bool) -> int:
    from disttrain.errors import ConfigError
    from disttrain.report.live import make_server

    try:
        server = make_server(paths, host, port, refresh_s)
    except OSError as e:
        raise ConfigError(f"report --live: cannot listen on {host}:{port} ({e.strerror or e}); try --port 0") from None
    url = f"http://{host}:{server.server_address[1]}/"
    print(f"serving the report of {', '.join(str(p) for p in paths)} at {url} (Ctrl-C stops)", flush=True)
    if open_page:
        webbrowser.open(url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
