"""The entry points' one way to refuse a command line: one line ``prog: why`` on stderr and
exit status 2, whatever the step that found the problem (a malformed ``key=value``, a bad
run config or grid, data that is not there)."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

Main = Callable[[list[str] | None], int]


class Refused(Exception):
    """A command line the script will not run; its message is the line it prints."""


@contextmanager
def refusing(*errors: type[Exception], prefix: str = "") -> Iterator[None]:
    """Inside: each of ``errors`` raised becomes a ``Refused`` saying ``prefix`` + its message
    (only there: the same error raised later is a bug, with its traceback)."""
    try:
        yield
    except errors as err:
        raise Refused(f"{prefix}{err}") from None


def refuses(prog: str) -> Callable[[Main], Main]:
    """``main`` whose ``Refused`` is printed as ``prog: why`` on stderr, returning 2."""
    def wrap(main: Main) -> Main:
        @functools.wraps(main)
        def run(argv: list[str] | None = None) -> int:
            try:
                return main(argv)
            except Refused as why:
                print(f"{prog}: {why}", file=sys.stderr)
                return 2
        return run
    return wrap
