"""Every file a docstring, comment or document points to exists.

The files scanned are found by walking the tree less .gitignore's patterns, so the check runs
in a release archive (``git archive``) as in a checkout. A mention is a relative path with a
directory (``docs/algorithms.md``, ``server_app/results.py``) or a bare upper-case Markdown
name (``README.md``; ``results.md`` is an output). Project paths are checked against the
repository (or the mentioning file's folder, for links inside docs/); ``flwr/...`` paths
against the installed Flower, whose internals several comments cite.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from functools import cache
from pathlib import Path

import flwr
import pytest

REPO = Path(__file__).resolve().parents[1]
FLOWER_ROOT = Path(flwr.__file__).resolve().parents[1]
SCANNED = {".py", ".md", ".toml", ".yaml", ".yml", ".sh"}
PATH = re.compile(r"(?<![\w./~$<{-])((?:[A-Za-z_][\w-]*/)+[\w-]+\.(?:py|md|toml|ya?ml|sh))\b")
BARE_MD = re.compile(r"(?<![\w./-])([A-Z][A-Z0-9_-]*\.md)\b")  # README.md, not results.md


@cache
def _ignore_patterns() -> tuple[str, ...]:
    """The repository's .gitignore lines (the files a release archive does not hold), read
    once: every pointer checks against them."""
    lines = (REPO / ".gitignore").read_text().splitlines()
    return tuple(line.strip() for line in lines if line.strip() and not line.startswith("#"))


def _ignored(rel: Path, patterns: Sequence[str]) -> bool:
    """Whether .gitignore's simple patterns (``name/``, ``dir/sub/``, ``*.ext``, ``name``)
    cover ``rel``."""
    for pattern in patterns:
        if pattern.endswith("/"):
            folder = pattern.rstrip("/")
            if "/" in folder:
                if rel.as_posix().startswith(folder + "/"):
                    return True
            elif any(fnmatch.fnmatch(part, folder) for part in rel.parts[:-1]):
                return True
        elif any(fnmatch.fnmatch(part, pattern) for part in rel.parts):
            return True  # no slash: a file or folder of that name at any depth, as git has it
    return False


def _project_files() -> list[Path]:
    """The project's scanned files, found by walking the tree (no git needed: a release
    archive has no .git), less what .gitignore excludes and this file."""
    patterns = [*_ignore_patterns(), ".git/"]
    this = Path(__file__).resolve()  # its examples name missing files on purpose
    found = []
    for root, dirs, names in os.walk(REPO):
        here = Path(root)
        # ignored folders are not entered (deploy/.build holds a root filesystem whose proc/
        # may be mounted while images build)
        dirs[:] = [d for d in dirs if not _ignored((here / d).relative_to(REPO) / "x",
                                                   patterns)]
        for name in names:
            path = here / name
            rel = path.relative_to(REPO)
            if (path.suffix in SCANNED and path.is_file() and path != this
                    and not _ignored(rel, patterns)):
                found.append(path)
    return sorted(found)


def _exists(ref: str, mentioned_in: Path) -> bool:
    """Exists, and not only in this checkout: a path .gitignore covers (``outputs/``, a
    build folder) is absent from a clean clone, so a pointer to one fails in CI."""
    if ref.startswith("flwr/"):
        return (FLOWER_ROOT / ref).exists()
    patterns = _ignore_patterns()
    for candidate in (REPO / ref, mentioned_in.parent / ref):
        resolved = candidate.resolve()
        if (resolved.exists() and resolved.is_relative_to(REPO)
                and not _ignored(resolved.relative_to(REPO), patterns)):
            return True
    return False


def test_every_mentioned_path_exists() -> None:
    files = _project_files()
    assert len(files) > 50, "the walk found too little to scan"
    md_names = {p.name for p in files if p.suffix == ".md"}
    missing, seen = [], 0
    for path in files:
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            where = f"{path.relative_to(REPO)}:{n}"
            for m in PATH.finditer(line):
                seen += 1
                if not _exists(m.group(1), path):
                    missing.append(f"{where}: {m.group(1)}")
            for m in BARE_MD.finditer(line):
                if m.group(1) not in md_names:
                    missing.append(f"{where}: {m.group(1)}")
    assert seen > 100, f"only {seen} path mentions found: is the pattern still right?"
    assert not missing, "pointers to files that do not exist:\n" + "\n".join(missing)


def test_the_scan_finds_a_missing_file(tmp_path: Path) -> None:
    """The pattern sees the forms the repository uses, and only paths."""
    text = ("see docs/algorithms.md, ``server_app/config.py``, (fedinit/task/noise.py) and "
            "ALGORITHMS.md; not results.md, https://x.org/a/b.py, ~/home/a.py, $OUT/x/y.py "
            "or 0.1/2.py")
    assert [m.group(1) for m in PATH.finditer(text)] == [
        "docs/algorithms.md", "server_app/config.py", "fedinit/task/noise.py"]
    assert [m.group(1) for m in BARE_MD.finditer(text)] == ["ALGORITHMS.md"]
    assert not _exists("server_app/config.py", tmp_path / "x.py")
    assert _exists("flwr/simulation/app.py", tmp_path / "x.py")


@pytest.mark.skipif(not (REPO / ".git").exists() or shutil.which("git") is None,
                    reason="not a git checkout (e.g. a release archive)")
def test_the_walk_scans_every_tracked_file() -> None:
    """In a checkout, the walk sees at least what git tracks (and what it adds is untracked)."""
    out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout.split()
    this = Path(__file__).resolve()
    tracked = {REPO / f for f in out if Path(f).suffix in SCANNED} - {this}
    assert tracked and not tracked - set(_project_files())


def test_ignored_paths_follow_gitignore() -> None:
    patterns = [".venv/", "__pycache__/", "*.pyc", "deploy/.build/"]
    assert _ignored(Path(".venv/lib/x.py"), patterns)
    assert _ignored(Path("client_app/__pycache__/a.py"), patterns)
    assert _ignored(Path("deploy/.build/x.yml"), patterns)
    assert not _ignored(Path("deploy/compose.yml"), patterns)
    assert not _ignored(Path("docs/algorithms.md"), patterns)


def test_a_pointer_into_an_ignored_folder_counts_as_missing(tmp_path: Path) -> None:
    """A file under ``outputs/`` exists here but not in CI's clean clone: a pointer to it
    must fail here too."""
    folder = REPO / "outputs"
    made = not folder.exists()
    folder.mkdir(exist_ok=True)
    probe = folder / f"doc-pointer-probe-{os.getpid()}.yaml"
    try:
        probe.write_text("x: 1\n")
        assert not _exists(f"outputs/{probe.name}", tmp_path / "x.md")
        assert _exists("docs/algorithms.md", tmp_path / "x.md")
    finally:
        probe.unlink(missing_ok=True)
        if made:
            folder.rmdir()
