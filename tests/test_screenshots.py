"""scripts/screenshots.py: the documentation's pictures made by the script, every request to
127.0.0.1. Fast: the off-host count and the argument checks; slow: the whole script into
tmp_path, its PNGs decoded and not blank."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from scripts import screenshots
from scripts.headless import LocalPage, off_host

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


@pytest.mark.slow
def test_the_script_writes_three_pictures_that_decode_and_are_not_blank(tmp_path: Path) -> None:
    pytest.importorskip(
        "playwright.sync_api", reason="pip install playwright (pyproject's dev extras)"
    )
    from PIL import Image, ImageStat

    from tests.browser_page import chromium

    chromium()
    out = tmp_path / "img"
    code = screenshots.main(
        [
            "--out",
            str(out),
            "--rounds",
            "3",
            "--clients",
            "4",
            "--train-limit",
            "400",
            "--dashboard-port",
            str(PORT),
            "--tensorboard-port",
            str(PORT + 1),
        ]
    )
    assert code == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(screenshots.NAMES)
    for name in screenshots.NAMES:
        with Image.open(out / name) as img:
            img.load()
            assert img.format == "PNG"
            width, height = img.size
            variance = ImageStat.Stat(img.convert("RGB")).var
        assert width >= 800 and height >= 100, (name, img.size)
        assert max(variance) > 0, (name, variance)


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
