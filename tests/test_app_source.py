"""The staged app is the checkout's FAB, byte for byte, and is listed without the venv."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from flwr.cli.build import build_fab_from_disk

from fedinit.flower_compat.app_source import app_files, staged_app

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # builds the checkout's FAB twice: about 15 s
def test_the_staged_fab_is_the_checkouts(tmp_path: Path) -> None:
    t0 = time.perf_counter()
    reference = build_fab_from_disk(REPO)  # Flower's own build of the whole checkout
    walk_all = time.perf_counter() - t0
    with staged_app(REPO) as app:
        assert app != REPO
        staged = build_fab_from_disk(app)
    assert staged == reference
    t0 = time.perf_counter()
    files = app_files(REPO)
    pruned = time.perf_counter() - t0
    assert files is not None and "pyproject.toml" in files
    assert not any(rel.startswith((".venv/", "outputs/")) for rel in files)
    print(f"Flower's build of the checkout {walk_all:.2f} s; app files listed in {pruned:.2f} s")


def test_a_toy_app_keeps_what_flower_keeps(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        (REPO / "pyproject.toml").read_text())
    (tmp_path / ".gitignore").write_text("outputs/\n*.pyc\nsecret.json\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("x = 1\n")
    (tmp_path / "pkg" / "a.pyc").write_bytes(b"\0")
    (tmp_path / "pkg" / "notes.txt").write_text("not an app file type\n")
    (tmp_path / "secret.json").write_text("{}\n")
    (tmp_path / "outputs").mkdir()
    (tmp_path / "outputs" / "run.json").write_text("{}\n")
    (tmp_path / "link.py").symlink_to(tmp_path / "pkg" / "a.py")
    files = app_files(tmp_path)
    assert files is not None
    assert sorted(files) == [".gitignore", (Path("pkg") / "a.py").as_posix(), "pyproject.toml"]


def test_a_reinclusion_falls_back_to_the_checkout(tmp_path: Path) -> None:
    (tmp_path / ".gitignore").write_text("outputs/\n!outputs/keep.json\n")
    assert app_files(tmp_path) is None
    with staged_app(tmp_path) as app:
        assert app == tmp_path
