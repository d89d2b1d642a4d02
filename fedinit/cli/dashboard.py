"""fedinit-dashboard RUN_OR_OUTPUT_DIR: the operator's live page of a run or a sweep.

A read-only page from Python's own ``http.server``, bound to 127.0.0.1 unless told otherwise.
It reads what the ServerApp writes as the run goes (``status.json``: the fleet;
``rounds.jsonl``: the rows) and draws the curves server-side as inline SVG, so the page loads
nothing from anywhere (its Content-Security-Policy forbids it) and reloads itself every
``--refresh`` seconds. Only GET and HEAD are answered; only the page and, per run, those two
files are served (looked up by name among the runs found, never by joining the request path
to a directory), so a checkpoint, client state or anything outside the directory is not
reachable whatever the path says. With ``--metrics`` (off by default) ``/metrics`` answers the
same figures in Prometheus' text format (fedinit/cli/dashboard_metrics.py); without it, 404.
"""

from __future__ import annotations

import argparse
import html
import math
import sys
import time
from collections.abc import Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from fedinit.cli.run_dirs import ROWS_FILE, find_runs, read_rows
from fedinit.cli.run_files import read_json
from server_app.status import STATUS_FILE

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

SERVED = (STATUS_FILE, ROWS_FILE)
"""The only files the page serves, per run."""
METRICS_PATH = "/metrics"
"""With ``--metrics``: the Prometheus text of every run (exactly this path)."""
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; " \
      "form-action 'none'; frame-ancestors 'none'"


# ---------------------------------------------------------------- reading a run
def run_facts(run: Path) -> dict[str, Any]:
    """What the page says about one run: its status (if the server wrote one), rows, config."""
    status = read_json(run / STATUS_FILE) or {}
    rows = read_rows(run / ROWS_FILE)
    config = read_json(run / "config.json") or {}
    info = dict(status.get("run") or {})
    if not info:  # a run made before status files: what its rows and config say
        info = {"name": run.name, "round": rows[-1].get("round") if rows else 0,
                "rounds": config.get("num-server-rounds"),
                "state": "done" if (run / "summary.json").is_file() else "no status file",
                "dp": config.get("dp", "off"), "eval-source": config.get("evaluation")}
    return {"status": status, "rows": rows, "run": info}


# ---------------------------------------------------------------- drawing
def _fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return html.escape(str(value))


def _ago(t: Any, now: float) -> str:
    return "-" if not isinstance(t, int | float) else f"{max(0.0, now - t):.0f} s ago"


def svg_curve(rows: Sequence[dict[str, Any]], key: str, title: str,
              target: float | None = None, width: int = 420, height: int = 180) -> str:
    """An inline SVG line of ``key`` against round: one <circle class="pt"> per row that has
    the value (a target, e.g. the epsilon budget, as a dashed line)."""
    pts = [(float(r["round"]), float(r[key])) for r in rows
           if isinstance(r.get(key), int | float) and math.isfinite(r[key])
           and isinstance(r.get("round"), int | float)]
    pad = 34
    body = [f'<text x="{pad}" y="14" class="t">{html.escape(title)}</text>']
    if pts:
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        if target is not None:
            ys = [*ys, target]
        x0, x1 = min(xs), max(max(xs), min(xs) + 1)
        y0, y1 = min(ys), max(ys)
        if y1 - y0 < 1e-12:
            y0, y1 = y0 - 0.5, y1 + 0.5

        def sx(x: float) -> float:
            return pad + (x - x0) / (x1 - x0) * (width - pad - 10)

        def sy(y: float) -> float:
            return height - 22 - (y - y0) / (y1 - y0) * (height - 44)

        line = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
        body.append(f'<polyline fill="none" stroke="#1565c0" stroke-width="1.5" '
                    f'points="{line}"/>')
        body += [f'<circle class="pt" cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5">'
                 f'<title>round {x:g}: {y:.4g}</title></circle>' for x, y in pts]
        if target is not None:
            body.append(f'<line class="target" x1="{pad}" x2="{width - 10}" '
                        f'y1="{sy(target):.1f}" y2="{sy(target):.1f}" stroke="#c62828" '
                        f'stroke-dasharray="4 3"/>')
        body += [f'<text x="2" y="{sy(y1) + 4:.1f}" class="a">{y1:.3g}</text>',
                 f'<text x="2" y="{sy(y0) + 4:.1f}" class="a">{y0:.3g}</text>',
                 f'<text x="{pad}" y="{height - 6}" class="a">round {x0:g}</text>',
                 f'<text x="{width - 60}" y="{height - 6}" class="a">round {x1:g}</text>']
    else:
        body.append(f'<text x="{pad}" y="{height / 2}" class="a">no values yet</text>')
    return (f'<svg class="curve" data-key="{html.escape(key)}" width="{width}" '
            f'height="{height}" viewBox="0 0 {width} {height}" '
            f'xmlns="http://www.w3.org/2000/svg">{"".join(body)}</svg>')


def participation(rounds: Sequence[int], first: int, last: int) -> str:
    """A strip with one cell per round, filled where the node's client had a task."""
    if last < first:
        return ""
    n = last - first + 1
    w = max(2, min(8, 240 // n))
    have = set(rounds)
    cells = "".join(f'<rect x="{i * w}" y="0" width="{w - 1}" height="10" '
                    f'fill="{"#2e7d32" if first + i in have else "#e0e0e0"}"/>'
                    for i in range(n))
    return (f'<svg class="part" width="{n * w}" height="10" '
            f'xmlns="http://www.w3.org/2000/svg">{cells}</svg>')


STYLE = """body{font-family:sans-serif;margin:1.2em;color:#222}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 6px;
font-size:13px;text-align:left}th{background:#f3f3f3}.t{font-size:12px;font-weight:bold}
.a{font-size:10px;fill:#555}.refused,.refused-retrying{background:#ffebee}
.waiting-for-identity{background:#fff8e1}
tr[data-connected="no"]{color:#777}.bar{width:300px;height:12px;background:#eee;
display:inline-block}.bar>span{display:block;height:12px;background:#1565c0}
.note{color:#555;font-size:13px}"""


def _page(title: str, body: str, refresh: int) -> str:
    meta = f'<meta http-equiv="refresh" content="{refresh}">' if refresh > 0 else ""
    return (f"<!DOCTYPE html><html><head><meta charset=\"utf-8\">{meta}"
            f"<title>{html.escape(title)}</title><style>{STYLE}</style></head>"
            f"<body>{body}</body></html>")


TOTALS = {"missing": "no reply (timed out)"}
"""The page's words for status.json's task outcomes, as the fleet table's column says."""


def _client(node: dict[str, Any]) -> str:
    """The node's client id; before it answered, the one node-registry gives it."""
    if node.get("client") is not None:
        return _fmt(node.get("client"))
    registered = node.get("registered-client")
    return "-" if registered is None else f"({_fmt(registered)} registered)"


def _connected(node: dict[str, Any], now: float) -> str:
    """yes / no, with when the SuperLink last listed it (a status file before the column
    existed: -)."""
    if "connected" not in node:
        return "-"
    if node["connected"]:
        return "yes"
    last = node.get("last-connected")
    return "no" + ("" if last is None else f" (last {_ago(last, now)})")


def fleet_table(status: dict[str, Any], first: int, last: int, now: float) -> str:
    fleet = status.get("fleet") or {}
    nodes = fleet.get("nodes") or []
    private = fleet.get("per-node-tasks", "written") != "written"
    head = ["node", "client", "state", "connected", "reason", "identity answered", "waiting"]
    if not private:
        head += ["last answer", "sent", "replied", "rejected", "no reply (timed out)",
                 "train s", "participation"]
    out = ['<table id="fleet"><tr>' + "".join(f"<th>{h}</th>" for h in head) + "</tr>"]
    for n in nodes:
        state = str(n.get("state", "?"))
        cells = [_client(n), html.escape(state), _connected(n, now), _fmt(n.get("reason")),
                 _ago(n.get("identity-seen"), now),
                 "-" if n.get("waiting-seconds") is None else f"{n['waiting-seconds']:.0f} s"]
        if not private:
            t = n.get("tasks") or {}
            rej = n.get("rejected-reasons") or {}
            why = "; ".join(f"{html.escape(k)} x{v}" for k, v in rej.items())
            cells += [_ago(n.get("last-seen"), now), _fmt(t.get("sent")),
                      _fmt(t.get("replied")),
                      f'{_fmt(t.get("rejected"))}{" (" + why + ")" if why else ""}',
                      _fmt(t.get("missing")), _fmt(n.get("train-seconds"), 3),
                      participation(n.get("rounds") or [], first, last)]
        link = {True: "yes", False: "no"}.get(n.get("connected"), "-")
        out.append(f'<tr class="{html.escape(state)}" data-node="{_fmt(n.get("node"))}" '
                   f'data-connected="{link}"><td>{_fmt(n.get("node"))}</td>'
                   + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    out.append("</table>")
    if private:
        out.append(f'<p class="note" id="dp-note">Per-node tasks and participation: '
                   f'{html.escape(str(fleet.get("per-node-tasks")))}.</p>')
    totals = fleet.get("totals") or {}
    if totals:
        out.append('<p id="totals">Tasks this server process: ' + ", ".join(
            f"{TOTALS.get(k, k)} {_fmt(v)}" for k, v in totals.items()) + "</p>")
    return "".join(out)


def run_body(key: str, facts: dict[str, Any], now: float) -> str:
    """The page of one run: progress, curves, rejections, the fleet."""
    run, rows, status = facts["run"], facts["rows"], facts["status"]
    rnd, total = run.get("round") or 0, run.get("rounds") or 0
    share = min(1.0, rnd / total) if total else 0.0
    elapsed = run.get("elapsed-seconds")
    done = rnd - (run.get("first-round", 1) - 1)
    eta = (elapsed / done * (total - rnd) if isinstance(elapsed, int | float) and done > 0
           and run.get("state") == "running" else None)
    parts = [f'<h1>{html.escape(str(run.get("name") or key or "run"))}</h1>',
             f'<p id="progress">state <b>{_fmt(run.get("state"))}</b>, round {_fmt(rnd)} of '
             f'{_fmt(total)} <span class="bar"><span style="width:{300 * share:.0f}px">'
             f'</span></span> elapsed {_fmt(elapsed, 3)} s'
             f'{f", ETA {eta:.0f} s" if eta is not None else ""}; evaluation '
             f'{_fmt(run.get("eval-source"))}; method {_fmt(run.get("method"))}; '
             f'dp {_fmt(run.get("dp"))}; status written '
             f'{_ago(status.get("written"), now)}</p>']
    if isinstance(run.get("round-seconds"), int | float):
        wait = run.get("collect-seconds") or 0.0
        parts.append(f'<p id="round-time">last round {run["round-seconds"]:.3g} s: waiting '
                     f'for replies {wait:.3g} s, the server\'s own work '
                     f'{run["round-seconds"] - wait:.3g} s</p>')
    parts.append('<div id="curves">' + svg_curve(rows, "test-acc", "accuracy")
                 + svg_curve(rows, "test-loss", "loss"))
    if run.get("dp", "off") != "off":
        target = run.get("dp-target-epsilon")
        parts.append(svg_curve(rows, "dp-epsilon", f"epsilon (target {_fmt(target)})",
                               target if isinstance(target, int | float) else None))
        parts.append(f'<p id="epsilon">epsilon {_fmt(run.get("dp-epsilon"))} of target '
                     f'{_fmt(target)} at delta {_fmt(run.get("dp-delta"))}</p>')
    parts.append("</div>")
    reasons = (status.get("fleet") or {}).get("rejected-by-reason") or {}
    parts.append("<h2>Rejected replies by reason</h2>" + (
        '<table id="rejected"><tr><th>reason</th><th>replies</th></tr>' + "".join(
            f"<tr><td>{html.escape(k)}</td><td>{_fmt(v)}</td></tr>" for k, v in reasons.items())
        + "</table>" if reasons else '<p id="rejected">none</p>'))
    parts.append("<h2>Fleet</h2>")
    parts.append(fleet_table(status, run.get("first-round", 1), rnd, now) if status
                 else '<p id="fleet">no status.json in this run directory yet</p>')
    return "".join(parts)


def sweep_body(runs: dict[str, Path], now: float) -> str:
    """The runs of an output directory side by side: state, progress, accuracy curves."""
    out = [f"<h1>{len(runs)} runs</h1><table id='runs'><tr><th>run</th><th>state</th>"
           "<th>round</th><th>last acc</th><th>best acc</th><th>epsilon</th><th>accuracy</th>"
           "</tr>"]
    for key, path in runs.items():
        f = run_facts(path)
        accs = [r["test-acc"] for r in f["rows"] if isinstance(r.get("test-acc"), int | float)]
        run = f["run"]
        last_eps = next((r["dp-epsilon"] for r in reversed(f["rows"])
                         if isinstance(r.get("dp-epsilon"), int | float)), None)
        out.append(f'<tr><td><a href="/{html.escape(key)}/">{html.escape(key)}</a></td>'
                   f'<td>{_fmt(run.get("state"))}</td><td>{_fmt(run.get("round"))}/'
                   f'{_fmt(run.get("rounds"))}</td><td>{_fmt(accs[-1] if accs else None)}</td>'
                   f'<td>{_fmt(max(accs) if accs else None)}</td><td>{_fmt(last_eps)}</td>'
                   f'<td>{svg_curve(f["rows"], "test-acc", "", width=200, height=60)}</td>'
                   "</tr>")
    out.append("</table>")
    return "".join(out)


# ---------------------------------------------------------------- serving
class Handler(BaseHTTPRequestHandler):
    """GET/HEAD of the page and its two files; every other method is 405."""

    root: Path
    refresh: int
    metrics: CollectorRegistry | None = None
    """The private registry ``/metrics`` answers from; None: ``--metrics`` was not given."""
    server_version = "fedinit-dashboard"
    sys_version = ""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self._answer(head=False)

    def do_HEAD(self) -> None:  # noqa: N802
        self._answer(head=True)

    def _refuse_method(self) -> None:
        self._send(HTTPStatus.METHOD_NOT_ALLOWED, b"only GET and HEAD\n", "text/plain",
                   extra={"Allow": "GET, HEAD"})

    def __getattr__(self, name: str) -> Any:
        """Any other method (POST, PUT, DELETE, ... or a made-up one) is refused with 405,
        not http.server's 501."""
        if name.startswith("do_"):
            return self._refuse_method
        raise AttributeError(name)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - base signature
        pass  # quiet: the page reloads every few seconds

    def _answer(self, head: bool) -> None:
        body, kind = self.route(self.path)
        if body is None:
            self._send(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain", head=head)
        else:
            self._send(HTTPStatus.OK, body, kind, head=head)

    def route(self, raw: str) -> tuple[bytes | None, str]:
        """The page or one served file for a request path; (None, '') for anything else."""
        path = unquote(urlsplit(raw).path) if raw.startswith("/") else ""
        if not path.startswith("/") or "\\" in path or "\x00" in path:
            return None, ""
        parts = [p for p in path.split("/") if p]
        if any(p in (".", "..") for p in parts):
            return None, ""
        if path == METRICS_PATH and self.metrics is not None:
            from fedinit.cli.dashboard_metrics import CONTENT_TYPE, scrape
            return scrape(self.metrics), CONTENT_TYPE
        runs, now = find_runs(self.root), time.time()
        name = parts[-1] if parts and parts[-1] in SERVED else None
        key = "/".join(parts[:-1] if name else parts)
        if key not in runs:
            if key == "" and runs:  # an output directory: the sweep page
                return _page("fedinit sweep", sweep_body(runs, now), self.refresh).encode(), \
                    "text/html; charset=utf-8"
            return None, ""
        if name is not None:
            try:
                return (runs[key] / name).read_bytes(), (
                    "application/json" if name == STATUS_FILE else "application/x-ndjson")
            except OSError:
                return None, ""
        page = _page(f"fedinit {key or runs[key].name}",
                     run_body(key, run_facts(runs[key]), now), self.refresh)
        return page.encode(), "text/html; charset=utf-8"

    def _send(self, code: HTTPStatus, body: bytes, kind: str, head: bool = False,
              extra: dict[str, str] | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Security-Policy", CSP)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Cache-Control", "no-store")
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if not head:
            self.wfile.write(body)


def make_server(root: Path, host: str = "127.0.0.1", port: int = 8050,
                refresh: int = 2, metrics: bool = False) -> ThreadingHTTPServer:
    """The page's server for ``root`` (not started: call ``serve_forever``); ``metrics``:
    answer ``/metrics`` too."""
    registry = None
    if metrics:  # imported only when asked: the page itself needs no prometheus_client
        from fedinit.cli.dashboard_metrics import registry_for
        registry = registry_for(root.resolve())
    handler = type("DashboardHandler", (Handler,), {"root": root.resolve(),
                                                    "refresh": refresh, "metrics": registry})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="fedinit-dashboard", description=__doc__.splitlines()[0])
    p.add_argument("path", help="a run directory, or an output directory holding runs")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8050, help="port (default 8050; 0: any free)")
    p.add_argument("--refresh", type=int, default=2,
                   help="seconds between the page's reloads (default 2; 0: never)")
    p.add_argument("--metrics", action="store_true",
                   help="also answer /metrics: the figures in Prometheus' text format "
                        "(default off: 404)")
    a = p.parse_args(argv)
    root = Path(a.path)
    if not root.is_dir():
        p.error(f"{a.path!r} is not a directory: give a run directory or an output directory")
    if not 0 <= a.port <= 65535:
        p.error(f"--port={a.port} is not allowed: 0..65535")
    if a.refresh < 0:
        p.error(f"--refresh={a.refresh} is not allowed: 0 or more seconds")
    try:
        server = make_server(root, a.host, a.port, a.refresh, a.metrics)
    except OSError as err:
        p.error(f"cannot listen on {a.host}:{a.port}: {err.strerror or err}")
    host, port = server.server_address[:2]
    print(f"fedinit-dashboard: http://{host}:{port}/ (read-only; Ctrl-C stops)"
          + (f"; Prometheus: http://{host}:{port}{METRICS_PATH}" if a.metrics else ""),
          flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
