"""One fresh interpreter for the checks that a client's data comes out the same in another
process (a simulation worker, a SuperNode): the local test split (tests/test_local_split.py)
and the regimes (tests/test_regimes.py). Each check used to start its own, paying torch's
import and the data set's load (about 5 s of CPU) twice; pytest-xdist's workers now share one
answer through a file in the session's temporary folder, under a lock."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from filelock import FileLock

from fedinit.cli.flower_env import REPO

HASH_SEED = "123"
"""The other process's PYTHONHASHSEED: set, so that it is not this process's random one."""

CODE = """
import hashlib, json, sys
from fedinit.config import RunConfig
from fedinit.task.federated_data import client_examples, local_test_indices, regimes_of
split, regimes = (RunConfig.parse(json.loads(raw)) for raw in sys.argv[1:3])
def digest(arrays): return hashlib.sha256(b''.join(a.tobytes() for a in arrays)).hexdigest()
print(json.dumps({
    "split": digest(local_test_indices(split, p) for p in range(split.num_clients)),
    "regimes": [int(r) for r in regimes_of(regimes)],
    "labels": digest(client_examples(regimes, p)[1] for p in range(regimes.num_clients))}))
"""


def computed(split_run: dict[str, Any], regimes_run: dict[str, Any]) -> dict[str, Any]:
    """What a fresh interpreter computes: the digest of every client's local test indices
    under ``split_run``, and the regimes and digest of every client's labels under
    ``regimes_run``."""
    out = subprocess.run([sys.executable, "-c", CODE, json.dumps(split_run),
                          json.dumps(regimes_run)], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": HASH_SEED, "PATH": ""}, cwd=REPO, timeout=300)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def shared(folder: Path, split_run: dict[str, Any], regimes_run: dict[str, Any]
           ) -> dict[str, Any]:
    """``computed``, once for every process that asks with the same ``folder`` (the xdist
    session's temporary folder) and the same runs."""
    key = json.dumps([split_run, regimes_run], sort_keys=True)
    path = folder / "another_process.json"
    with FileLock(str(path) + ".lock"):
        if path.is_file():
            cached = json.loads(path.read_text())
            if cached["key"] == key:
                return dict(cached["answer"])
        answer = computed(split_run, regimes_run)
        path.write_text(json.dumps({"key": key, "answer": answer}))
    return answer
