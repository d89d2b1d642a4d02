"""A copy of this project's Flower App whose ClientApp misbehaves on purpose (tests, bench).

The train handler gets extra code right after it knows its round and partition
(``_round``, ``cid``): raise, SIGKILL its own worker, or hang. The copy is a separate FAB, so
a deployment serves it beside the unchanged app.
"""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

from fedinit.cli.flower_env import REPO


def app_parts() -> tuple[str, ...]:
    """pyproject.toml and every top-level package the wheel declares (its ``packages.find``
    patterns: the card's three and the ``fedinit`` namespace): a hand-kept list missed
    ``store/`` once, and the copy's ServerApp failed to import (exit code 607)."""
    with (REPO / "pyproject.toml").open("rb") as f:
        include = tomllib.load(f)["tool"]["setuptools"]["packages"]["find"]["include"]
    return ("pyproject.toml", *sorted({p.rstrip("*").split(".")[0] for p in include}))

ANCHOR = "    cid = partition_of(context, cfg, msg)\n    conf ="
ROUND = "    _round = int(msg.content.config_records[rk.CONFIG][rk.ROUND])\n"


def raise_at(server_round: int, cid: int) -> str:
    return f'''    if (_round, cid) == ({server_round}, {cid}):
        raise RuntimeError("injected fault")
'''


def sigkill_at(server_round: int, cid: int) -> str:
    return f'''    if (_round, cid) == ({server_round}, {cid}):
        import os, signal
        os.kill(os.getpid(), signal.SIGKILL)
'''


def hang_at(server_round: int, cid: int, child_pid_file: Path) -> str:
    """The task sleeps forever, beside a child process (as a data loader's workers would be)
    whose pid it writes to ``child_pid_file``: a kill must take the child too."""
    return f'''    if (_round, cid) == ({server_round}, {cid}):
        import subprocess, sys, time
        _child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(10**6)"])
        open({str(child_pid_file)!r}, "w").write(str(_child.pid))
        while True:
            time.sleep(3600)
'''


def hang_when_told(order_file: Path, cid: int, child_pid_file: Path) -> str:
    """``hang_at`` for a round chosen while the run goes on: client ``cid`` hangs in the round
    whose number ``order_file`` holds (written by the caller before that round starts)."""
    body = hang_at(0, cid, child_pid_file).split("\n", 1)[1]
    return f'''    import os as _os
    if cid == {cid} and _os.path.exists({str(order_file)!r}) and \\
            _round == int(open({str(order_file)!r}).read()):
''' + body


def fault_app(dest: Path, *faults: str) -> Path:
    """Copy the app to ``dest`` with ``faults`` (from the functions above) in its train
    handler; the copy's ``client_app/app.py`` fails loudly if the anchor moved."""
    dest.mkdir(parents=True)
    for part in app_parts():
        src = REPO / part
        if src.is_dir():
            shutil.copytree(src, dest / part, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(src, dest / part)
    app = dest / "client_app" / "app.py"
    text = app.read_text()
    assert ANCHOR in text, "client_app/app.py changed: update the fault injection anchor"
    head = "    cid = partition_of(context, cfg, msg)\n"
    app.write_text(text.replace(ANCHOR, head + ROUND + "".join(faults) + "    conf =", 1))
    return dest
