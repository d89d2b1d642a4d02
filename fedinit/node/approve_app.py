"""Approve an app on this device: print its FAB hash, or append it to the approved-apps file.

    python -m fedinit.node.approve_app <app dir | app.fab> [--append FILE] [--note TEXT]

An app directory is built into its FAB exactly as ``flwr run`` builds it (Flower's
``build_fab_from_disk``, on the app's files only: ``fedinit.flower_compat.app_source``), so the hash
printed is the one the SuperNode will be sent; a ``.fab`` file is hashed as it is. Approving
is the owner's deliberate step (deploy/edge/README.md, "Only approved apps"): build or
receive the new version, check it, append its hash; the old line may stay or be removed.
"""

from __future__ import annotations

import argparse
import datetime
from pathlib import Path

from fedinit.node.app_allowlist import AllowlistError, fab_hash, read


def fab_of(path: Path) -> bytes:
    """The FAB bytes of an app directory (built as ``flwr run`` builds them) or a .fab file."""
    if path.is_file():
        return path.read_bytes()
    if not (path / "pyproject.toml").is_file():
        raise SystemExit(f"approve_app: {path} is not allowed; allowed: a Flower App "
                         "directory (with pyproject.toml) or a .fab file")
    from flwr.cli.build import build_fab_from_disk

    from fedinit.flower_compat.app_source import staged_app

    with staged_app(path.resolve()) as source:
        return build_fab_from_disk(source)


def append(file: Path, digest: str, note: str) -> bool:
    """Add ``digest`` to ``file`` (created if missing); False when it is approved already."""
    if file.exists():
        try:
            if digest in read(file):
                return False
        except AllowlistError as err:
            raise SystemExit(f"approve_app: {err}") from None
    file.parent.mkdir(parents=True, exist_ok=True)
    text = file.read_text(encoding="utf-8") if file.exists() else (
        "# approved apps of this device (python -m fedinit.node.approve_app)\n")
    if text and not text.endswith("\n"):
        text += "\n"
    file.write_text(text + f"{digest}  # {note}\n", encoding="utf-8")
    return True


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m fedinit.node.approve_app",
                                description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("app", type=Path, help="the app directory or its .fab file")
    p.add_argument("--append", type=Path, metavar="FILE",
                   help="add the hash to this approved-apps file (created if missing)")
    p.add_argument("--note", help="the comment written after the hash (default: the app's "
                                  "path and today's date)")
    args = p.parse_args(argv)
    if not args.app.exists():
        p.error(f"{args.app} does not exist; allowed: an app directory or a .fab file")
    digest = fab_hash(fab_of(args.app))
    print(digest)
    if args.append is not None:
        note = args.note or f"{args.app.resolve().name}, approved {datetime.date.today()}"
        added = append(args.append, digest, " ".join(note.split()))
        print(f"{'appended to' if added else 'already in'} {args.append}")


if __name__ == "__main__":
    main()
