"""Every file a docstring, comment or document points to exists.

A mention is a relative path with a directory (``docs/algorithms.md``, ``server_app/results.py``)
or a bare upper-case Markdown name (``README.md``; ``results.md`` is an output). Project paths
are checked against the repository (or the mentioning file's folder, for links inside
docs/); ``flwr/...`` paths against the installed Flower, whose internals several comments cite.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import flwr

REPO = Path(__file__).resolve().parents[1]
FLOWER_ROOT = Path(flwr.__file__).resolve().parents[1]
SCANNED = {".py", ".md", ".toml", ".yaml", ".yml", ".sh"}
PATH = re.compile(r"(?<![\w./~$<{-])((?:[A-Za-z_][\w-]*/)+[\w-]+\.(?:py|md|toml|ya?ml|sh))\b")
BARE_MD = re.compile(r"(?<![\w./-])([A-Z][A-Z0-9_-]*\.md)\b")  # README.md, not results.md


def _tracked() -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout.split()
    this = Path(__file__).resolve()  # its examples name missing files on purpose
    return [REPO / f for f in out if Path(f).suffix in SCANNED and REPO / f != this]


def _exists(ref: str, mentioned_in: Path) -> bool:
    if ref.startswith("flwr/"):
        return (FLOWER_ROOT / ref).exists()
    return (REPO / ref).exists() or (mentioned_in.parent / ref).exists()


def test_every_mentioned_path_exists() -> None:
    files = _tracked()
    assert len(files) > 50, "git ls-files found too little to scan"
    md_names = {p.name for p in REPO.rglob("*.md") if ".venv" not in p.parts}
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
    text = ("see docs/algorithms.md, ``server_app/config.py``, (task/noise.py) and "
            "ALGORITHMS.md; not results.md, https://x.org/a/b.py, ~/home/a.py, $OUT/x/y.py "
            "or 0.1/2.py")
    assert [m.group(1) for m in PATH.finditer(text)] == [
        "docs/algorithms.md", "server_app/config.py", "task/noise.py"]
    assert [m.group(1) for m in BARE_MD.finditer(text)] == ["ALGORITHMS.md"]
    assert not _exists("server_app/config.py", tmp_path / "x.py")
    assert _exists("flwr/simulation/app.py", tmp_path / "x.py")
