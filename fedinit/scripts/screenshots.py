"""The documentation's pictures of the live page and of TensorBoard, made by a script.

    .venv/bin/python -m fedinit.scripts.screenshots                 # two small runs, into docs/img
    .venv/bin/python -m fedinit.scripts.screenshots --from outputs  # runs already made

Without ``--from`` it makes two short in-process runs (fedinit/cli/inprocess_run.py's real
ServerApp and ClientApp code; FedAvg and FedInit, the same seed) in a temporary directory.
It then serves that directory with ``fedinit-dashboard``'s server and ``tensorboard --logdir``
on 127.0.0.1 and has Debian's headless chromium (fedinit/scripts/headless.py, as the browser tests)
save three PNGs: a run's page with its fleet (``dashboard-run.png``), the output directory's
page of runs side by side (``dashboard-sweep.png``) and TensorBoard's time series of the runs'
``eval/`` tags (``tensorboard-sweep.png``). Every request the browser makes is counted: one to
any host but 127.0.0.1 fails the script, and its pictures are not written.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path

from fedinit.cli.dashboard import make_server
from fedinit.cli.flower_env import REPO
from fedinit.cli.run_dirs import find_runs
from fedinit.scripts.headless import BrowserError, LocalPage, open_browser

RUN_PAGE, SWEEP_PAGE, TENSORBOARD = (
    "dashboard-run.png",
    "dashboard-sweep.png",
    "tensorboard-sweep.png",
)
NAMES = (RUN_PAGE, SWEEP_PAGE, TENSORBOARD)
RUNS = {"beta": (0.0, 0.1)}
"""The two runs: FedAvg (no relaxed initialization) and FedInit (beta=0.1)."""
SMALL = {
    "num-server-rounds": 8,
    "train-limit": 4000,
    "num-clients": 20,
    "fraction-train": 0.5,
    "personal-eval-every": 0,
    "seed": 0,
}
"""A run of about 15 s on a loaded 2-core machine: a curve of 8 points."""
SIZES = (("--rounds", "num-server-rounds", "rounds"), ("--clients", "num-clients", "clients"),
         ("--train-limit", "train-limit", "training examples"))
"""The options that size the runs made: (flag, run-config key in SMALL, what it counts)."""
READY = """() => document.readyState === 'complete' && !!document.querySelector('svg.curve')"""
TB_URL = re.compile(r"TensorBoard \S+ at (http://127\.0\.0\.1:\d+/)")
TB_CARD = "eval/test-acc"
TB_FILTER = 'input[placeholder="Filter tags (regex)"]'
TB_CLOSE_SETTINGS = 'button[aria-label="Close side pane"]'


class ScreenshotError(RuntimeError):
    """A picture could not be made (or the browser asked something of another host)."""


def make_runs(out: Path, rounds: int, clients: int, train_limit: int) -> None:
    """The two in-process runs under ``out`` (torch on one thread, as inprocess_run)."""
    import torch

    from fedinit.cli.inprocess_grid import InProcessGrid
    from fedinit.config import RunConfig
    from server_app.experiment import run_experiment

    torch.set_num_threads(1)
    for beta in RUNS["beta"]:
        raw = {
            **SMALL,
            "num-server-rounds": rounds,
            "num-clients": clients,
            "train-limit": train_limit,
            "beta": beta,
            "output-dir": str(out),
        }
        cfg = RunConfig.parse(raw)
        run_experiment(InProcessGrid(cfg.num_clients, raw), cfg)


@contextmanager
def dashboard(root: Path, port: int) -> Iterator[str]:
    """``fedinit-dashboard``'s server on 127.0.0.1 (no reload: a picture is one document)."""
    server = make_server(root, port=port, refresh=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def tensorboard(logdir: Path, port: int, log: Path, timeout: float = 120.0) -> Iterator[str]:
    """``tensorboard --logdir`` on 127.0.0.1 (its Python loader: no data server on a port of
    its own); its URL once it answers."""
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tensorboard.main",
                "--logdir",
                str(logdir),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--load_fast",
                "false",
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        deadline = time.monotonic() + timeout
        while True:
            text = log.read_text(errors="replace")
            if m := TB_URL.search(text):
                with suppress(OSError), urllib.request.urlopen(m.group(1), timeout=5):
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise ScreenshotError(f"tensorboard did not start: {text[-800:]}")
            time.sleep(0.3)
        yield m.group(1)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def shoot_dashboard(tab: LocalPage, url: str, path: Path) -> None:
    """One full page of the dashboard, once its curves are drawn."""
    tab.page.goto(url)
    tab.page.wait_for_function(READY, timeout=30_000)
    tab.shoot(path)


def shoot_tensorboard(tab: LocalPage, url: str, path: Path) -> None:
    """TensorBoard's time series filtered to ``eval/``, once the test-acc card is drawn."""
    tab.page.goto(url + "#timeseries")
    box = tab.page.locator(TB_FILTER).first
    box.wait_for(timeout=60_000)
    box.fill("eval/")
    close = tab.page.locator(TB_CLOSE_SETTINGS)
    if close.count():  # the settings pane opens by default: room for the cards instead
        close.first.click()
    tab.page.get_by_text(TB_CARD, exact=True).first.wait_for(timeout=60_000)
    tab.page.wait_for_function(
        "() => document.querySelectorAll('canvas, svg path, line-chart').length > 0", timeout=30_000
    )
    tab.page.wait_for_timeout(2000)  # the lines are drawn after the card (WebGL / canvas)
    tab.page.screenshot(path=str(path))


def make_pictures(
    root: Path,
    out: Path,
    dashboard_port: int = 0,
    tensorboard_port: int = 0,
    with_tensorboard: bool = True,
) -> list[Path]:
    """The PNGs of ``root``'s runs, written into ``out`` only if no request left 127.0.0.1."""
    runs = find_runs(root)
    if not runs or "" in runs:
        raise ScreenshotError(
            f"{root} holds no run directories: give an output directory "
            "(the runs side by side), not one run's directory"
        )
    key = sorted(runs)[-1]
    with tempfile.TemporaryDirectory(prefix="screenshots-") as tmp:
        staged = Path(tmp)
        with dashboard(root, dashboard_port) as page_url, open_browser(1400, 820) as tab:
            try:
                shoot_dashboard(tab, f"{page_url}{key}/", staged / RUN_PAGE)
                shoot_dashboard(tab, page_url, staged / SWEEP_PAGE)
                if with_tensorboard:
                    with tensorboard(root, tensorboard_port, staged / "tb.log") as tb:
                        shoot_tensorboard(tab, tb, staged / TENSORBOARD)
            except tab.reloading as err:  # Playwright's errors: a page that never drew
                raise ScreenshotError(f"a page did not load: {str(err).splitlines()[0]}") from err
            away, asked = tab.off_host(), len(tab.requests)
        if away:
            raise ScreenshotError(f"{len(away)} of {asked} requests left 127.0.0.1: {away[:5]}")
        out.mkdir(parents=True, exist_ok=True)
        made = []
        for name in NAMES:
            if (staged / name).exists():
                shutil.copyfile(staged / name, out / name)
                made.append(out / name)
    print(
        f"screenshots: {asked} requests, all to 127.0.0.1; wrote "
        + ", ".join(str(p) for p in made),
        flush=True,
    )
    return made


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="fedinit.scripts.screenshots",
                                description=__doc__.splitlines()[0])
    p.add_argument(
        "--out", default=str(REPO / "docs" / "img"), help="where the PNGs go (default docs/img)"
    )
    p.add_argument(
        "--from",
        dest="source",
        default=None,
        help="an output directory of finished runs (default: make two small runs)",
    )
    for flag, key, what in SIZES:
        p.add_argument(flag, type=int, default=SMALL[key],
                       help=f"{what} of each run made (default {SMALL[key]})")
    p.add_argument("--dashboard-port", type=int, default=0, help="default 0: any free")
    p.add_argument("--tensorboard-port", type=int, default=0, help="default 0: any free")
    p.add_argument("--no-tensorboard", action="store_true", help="only the page's pictures")
    a = p.parse_args(argv)
    for flag, _, _ in SIZES:
        if (value := getattr(a, flag[2:].replace("-", "_"))) < 1:
            p.error(f"{flag}={value} is not allowed: 1 or more")
    for name in ("dashboard_port", "tensorboard_port"):
        if not 0 <= getattr(a, name) <= 65535:
            p.error(f"--{name.replace('_', '-')}={getattr(a, name)} is not allowed: 0..65535")
    if a.source is not None and not Path(a.source).is_dir():
        p.error(f"--from={a.source!r} is not a directory: give an output directory of runs")
    work = None
    try:
        if a.source is None:
            work = Path(tempfile.mkdtemp(prefix="screenshot-runs-"))
            root = work / "out"
            make_runs(root, a.rounds, a.clients, a.train_limit)
        else:
            root = Path(a.source)
        make_pictures(root, Path(a.out), a.dashboard_port, a.tensorboard_port, not a.no_tensorboard)
    except (ScreenshotError, BrowserError) as err:
        print(f"screenshots: {err}", file=sys.stderr)
        return 1
    finally:
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
