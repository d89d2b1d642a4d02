"""The app's files for ``flwr run``, gathered without walking the virtual environment.

``flwr run APP`` builds the FAB (Flower App Bundle) by listing every file under APP
(``flwr/cli/utils.py`` ``collect_files``: ``os.walk`` and a ``resolve()`` per file) before its
.gitignore and publish rules keep the 160 that are the app. A checkout holds its ``.venv``
(41,000 files) and ``outputs/``, so listing took 2.3 s of every run's start, in every cell of
a sweep. ``staged_app`` walks the checkout with the directories .gitignore excludes left out,
keeps what Flower's own rules keep (``filter_paths_for_publish``, the function the build
applies) and copies those files into a temporary directory for ``flwr run`` to build from:
the same FAB, byte for byte (``tests/test_app_source.py``). Guard (table entry
``app-source``): ``collect_files`` (what this replaces) and the three rules it applies, as
checked; declined, or where .gitignore re-includes paths (``!``), the checkout itself is
used.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fedinit.flower_compat.guard import allowed

NAME = "app-source"

def app_files(root: Path) -> dict[str, Path] | None:
    """{relative posix path: file} of what Flower puts in the FAB of ``root``; None when the
    rules cannot be applied here (use ``root`` as it is)."""
    if not allowed(NAME):
        return None
    from flwr.cli.utils import build_pathspec, filter_paths_for_publish, load_gitignore_patterns

    gitignore = root / ".gitignore"
    patterns = load_gitignore_patterns(gitignore) if gitignore.is_file() else []
    if any(p.lstrip().startswith("!") for p in patterns):
        return None  # a re-included path may sit under an excluded directory
    ignored = build_pathspec(patterns)
    resolved_root = root.resolve()
    found: dict[str, Path] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        rel_dir = here.relative_to(root).as_posix()
        prefix = "" if rel_dir == "." else rel_dir + "/"
        dirnames[:] = [d for d in dirnames if not ignored.match_file(prefix + d + "/")]
        for name in filenames:
            path = here / name
            if path.is_symlink() or not path.resolve().is_relative_to(resolved_root):
                continue  # as Flower's collect_files
            found[prefix + name] = path
    return dict(filter_paths_for_publish(found))


@contextmanager
def staged_app(root: Path) -> Iterator[Path]:
    """A temporary directory holding only the app's files (or ``root`` itself, see above)."""
    files = app_files(root)
    if files is None:
        yield root
        return
    with tempfile.TemporaryDirectory(prefix="fedinit-app-") as tmp:
        for rel, src in files.items():
            dst = Path(tmp, rel)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
        yield Path(tmp)
