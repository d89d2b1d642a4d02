"""fedinit/scripts/screenshots.py: the documentation's pictures made by the script, every request to
127.0.0.1. Fast: the off-host count and the argument checks; slow: the whole script into
tmp_path, its PNGs decoded and showing their pages' own elements (the curves' points where
the rows put them, TensorBoard's lines in its accuracy card)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import pytest

from fedinit.scripts import screenshots
from fedinit.scripts.headless import LocalPage, off_host

PORT = int(os.environ.get("FEDINIT_TEST_SCREENSHOT_PORT", "44060"))
"""The page on PORT, TensorBoard on PORT + 1."""


def test_off_host_counts_every_request_but_127_0_0_1_and_in_browser_urls() -> None:
    urls = [
        "http://127.0.0.1:8050/",
        "http://127.0.0.1:6006/font.woff2?x=1",
        "data:image/png;base64,AAAA",
        "blob:http://127.0.0.1:6006/1f2e",
        "about:blank",
        "https://fonts.googleapis.com/css?family=Roboto",
        "http://localhost:8050/",
        "http://127.0.0.2/",
        "http://[::1]:8050/",
        "https://127.0.0.1.example.com/",
    ]
    assert off_host(urls) == urls[5:]


@pytest.mark.parametrize(
    "args, says",
    [
        (["--rounds", "0"], "--rounds=0 is not allowed: 1 or more"),
        (["--clients", "-2"], "--clients=-2 is not allowed: 1 or more"),
        (["--dashboard-port", "70000"], "--dashboard-port=70000 is not allowed: 0..65535"),
        (["--from", "/nonexistent/runs"], "--from='/nonexistent/runs' is not a directory"),
    ],
)
def test_bad_arguments_are_refused_before_any_work(
    args: list[str],
    says: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_runs(*_: object) -> None:
        raise AssertionError("a run was started")

    monkeypatch.setattr(screenshots, "make_runs", no_runs)
    with pytest.raises(SystemExit) as exit_:
        screenshots.main([*args, "--out", str(tmp_path / "img")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert says in err[-1], err
    assert not (tmp_path / "img").exists()


def test_a_run_directory_instead_of_an_output_directory_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "rounds.jsonl").write_text('{"round": 1, "test-acc": 0.5}\n')
    with pytest.raises(screenshots.ScreenshotError, match="not one run's directory"):
        screenshots.make_pictures(run, tmp_path / "img")
    assert not (tmp_path / "img").exists()


CURVES = """() => [...document.querySelectorAll('svg.curve')].map(svg => ({
  key: svg.dataset.key,
  run: svg.closest('tr')?.querySelector('a')?.textContent ?? null,
  fill: getComputedStyle(svg.querySelector('circle.pt') || svg).fill,
  points: [...svg.querySelectorAll('circle.pt')].map(c => {
    const r = c.getBoundingClientRect();
    return [r.left + r.width / 2 + window.scrollX, r.top + r.height / 2 + window.scrollY];
  }),
}))"""
"""Each curve of a page as drawn: its key, the run its table row links to (the page of runs),
its points' fill and their centres in page coordinates (those of a full-page picture)."""
TB_CHART = """(card) => {
  const area = e => { const r = e.getBoundingClientRect(); return r.width * r.height; };
  const chart = e => [...e.querySelectorAll('canvas, svg')].filter(c => area(c) > 10000);
  const named = [...document.querySelectorAll('*')].filter(
    e => e.textContent.trim() === card && area(e) > 0);
  let box = named[named.length - 1];
  while (box && !chart(box).length) box = box.parentElement;
  if (!box) return null;
  const r = chart(box).reduce((a, b) => area(a) >= area(b) ? a : b).getBoundingClientRect();
  return [r.left, r.top, r.right, r.bottom];
}"""
"""The viewport box of the chart (the largest canvas or svg over 100 x 100 px, not an icon)
in the card titled ``card``: the nearest ancestor of the visible title that holds one."""


def rgb(css: str) -> tuple[int, ...]:
    """'rgb(0, 0, 0)' -> (0, 0, 0)."""
    return tuple(int(v) for v in css[css.index("(") + 1:css.index(")")].split(",")[:3])


def affine(points: list[list[float]], rows: list[dict[str, Any]], key: str) -> bool:
    """Whether the points are the rows' (round, value) pairs under one affine map per axis,
    rounds to the right and larger values up (SVG's y grows down), to the SVG's 0.1 px: values
    that differ at least a pixel apart, one value throughout on one level."""
    pairs = [(r["round"], r[key]) for r in rows if isinstance(r.get(key), int | float)]
    if len(pairs) != len(points) or len(pairs) < 3:
        return False
    for axis, sign in ((0, 1.0), (1, -1.0)):
        data = np.array([p[axis] for p in pairs], dtype=np.float64)
        drawn = np.array([p[axis] for p in points], dtype=np.float64)
        if np.ptp(data) == 0:  # one value throughout: a flat line
            if np.ptp(drawn) > 0.5:
                return False
            continue
        design = np.vstack([data, np.ones_like(data)]).T
        (slope, offset), *_ = np.linalg.lstsq(design, drawn, rcond=None)
        if sign * slope * np.ptp(data) < 1.0:  # values that differ are drawn apart
            return False
        if np.abs(design @ [slope, offset] - drawn).max() > 0.5:
            return False
    return True


def read_rows(run: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run / "rounds.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_the_script_writes_three_pictures_that_show_the_pages_own_elements(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The script's three PNGs decode, and each shows what its page draws: on both dashboard
    pictures every curve point sits where the runs' rows put it (an affine map of round and
    value, per the page) and is painted in the point's colour in the PNG; on TensorBoard's,
    the eval/test-acc card's chart holds the runs' coloured lines."""
    pytest.importorskip(
        "playwright.sync_api", reason="pip install playwright (pyproject's dev extras)"
    )
    from PIL import Image

    from tests.browser_page import chromium

    chromium()
    kept = tmp_path / "runs"
    make_runs = screenshots.make_runs

    def and_keep(out: Path, rounds: int, clients: int, train_limit: int) -> None:
        make_runs(out, rounds, clients, train_limit)
        shutil.copytree(out, kept)  # the script removes its runs at the end

    drawn: dict[str, tuple[str, list[dict[str, Any]]]] = {}
    tb_box: list[list[float] | None] = []
    shoot_dashboard, shoot_tensorboard = screenshots.shoot_dashboard, screenshots.shoot_tensorboard

    def and_read_curves(tab: LocalPage, url: str, path: Path) -> None:
        shoot_dashboard(tab, url, path)
        drawn[path.name] = (url, tab.page.evaluate(CURVES))

    def and_read_chart(tab: LocalPage, url: str, path: Path) -> None:
        shoot_tensorboard(tab, url, path)
        tb_box.append(tab.page.evaluate(TB_CHART, screenshots.TB_CARD))

    monkeypatch.setattr(screenshots, "make_runs", and_keep)
    monkeypatch.setattr(screenshots, "shoot_dashboard", and_read_curves)
    monkeypatch.setattr(screenshots, "shoot_tensorboard", and_read_chart)
    out = tmp_path / "img"
    code = screenshots.main(
        ["--out", str(out), "--rounds", "3", "--clients", "4", "--train-limit", "400",
         "--dashboard-port", str(PORT), "--tensorboard-port", str(PORT + 1)]
    )
    assert code == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(screenshots.NAMES)
    runs = {p.parent: read_rows(p.parent) for p in kept.rglob("rounds.jsonl")}
    assert len(runs) == 2 and all(len(r) == 3 for r in runs.values())
    for name in screenshots.NAMES:
        with Image.open(out / name) as img:
            img.load()
            assert img.format == "PNG"
            pixels = np.asarray(img.convert("RGB"), dtype=np.int64)
        height, width, _ = pixels.shape
        assert width >= 800 and height >= 100, (name, width, height)
        if name == screenshots.TENSORBOARD:
            assert tb_box and tb_box[0], f"no {screenshots.TB_CARD} card with a chart"
            left, top, right, bottom = (int(v) for v in tb_box[0])
            chart = pixels[max(top, 0):bottom, max(left, 0):right]
            assert chart.size, (name, tb_box)
            coloured = (chart.max(axis=2) - chart.min(axis=2)) > 80
            assert coloured.sum() >= 30, (name, tb_box, int(coloured.sum()))
            continue
        url, curves = drawn[name]
        acc = [c for c in curves if c["key"] == "test-acc"]
        if name == screenshots.RUN_PAGE:  # the last run's page: its accuracy and loss
            key = urlsplit(url).path.strip("/")
            rows = runs[kept / key]
            assert [c["key"] for c in curves][:2] == ["test-acc", "test-loss"], curves
            for curve in curves[:2]:
                assert affine(curve["points"], rows, curve["key"]), (curve, rows)
        else:  # the page of runs: each run's row holds its accuracy curve
            assert sorted(kept / str(c["run"]) for c in acc) == sorted(runs), curves
            for curve in acc:
                assert affine(curve["points"], runs[kept / curve["run"]], "test-acc"), curve
        for curve in curves:
            fill = np.array(rgb(curve["fill"]))
            for x, y in curve["points"]:
                assert 0 <= x < width and 0 <= y < height, (name, x, y)
                seen = pixels[int(y), int(x)]
                assert np.abs(seen - fill).max() < 60, (name, curve["key"], x, y, seen, fill)


@pytest.mark.slow
def test_a_request_to_another_host_fails_the_script_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The browser's requests are really counted: a picture whose page also asks for an
    image from ``localhost`` (a name, not 127.0.0.1; port 1: nothing answers) fails."""
    pytest.importorskip(
        "playwright.sync_api", reason="pip install playwright (pyproject's dev extras)"
    )
    from tests.browser_page import chromium

    chromium()
    run = tmp_path / "out" / "run-a"
    run.mkdir(parents=True)
    (run / "rounds.jsonl").write_text(
        "".join(f'{{"round": {r}, "test-acc": {0.1 * r}}}\n' for r in (1, 2, 3))
    )
    shoot = screenshots.shoot_dashboard

    def and_an_image_elsewhere(tab: LocalPage, url: str, path: Path) -> None:
        shoot(tab, url, path)
        tab.page.set_content('<img src="http://localhost:1/x.png">')
        tab.page.wait_for_timeout(500)

    monkeypatch.setattr(screenshots, "shoot_dashboard", and_an_image_elsewhere)
    with pytest.raises(screenshots.ScreenshotError, match=r"requests left 127\.0\.0\.1"):
        screenshots.make_pictures(
            tmp_path / "out", tmp_path / "img", dashboard_port=PORT, with_tensorboard=False
        )
    assert not (tmp_path / "img").exists()
