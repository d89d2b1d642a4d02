"""Compressed uploads under ``rounds=async`` (issue 44 item 3): the FedBuff loop decodes each
reply against the model version its task was sent, and a client's top-k residual rolls back
with its accounted state, as in synchronous rounds.

On the least-squares testbed (``testbeds/lsq_async.py``: the real loop and client path),
SCAFFOLD over ``tests/test_async_state.py``'s script (a lost reply, a rejected one, one
dropped for staleness): the server's c is (1/N) sum of each client's c_i of the round the
server accounted for it, read from disk; ``bytes-up`` is the codec's wire size x the upload
channels x the replies buffered, flush by flush; the compressed run ends near the
uncompressed one, not on it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedinit.methods.compression import Compression
from fedinit.methods.scaffold import C_LOCAL
from fedinit.store.state_dir import StateDir
from testbeds.lsq_async import EXPERIMENT, ScriptedGrid, make_loop
from tests.test_async_state import DIM, SCRIPT, N, async_cfg, problem

RAW = {"method": "scaffold", "buffer-size": 2, "num-server-rounds": 5, "staleness": "poly",
       "staleness-a": 0.5, "max-staleness": 1}


def run(tmp: Path, codec: str) -> tuple[np.ndarray, Any, list[dict[str, Any]]]:
    """The run's final model, strategy and the flushes' rows."""
    grid = ScriptedGrid(problem(), async_cfg({**RAW, "compression": codec}), SCRIPT, tmp)
    loop, strategy = make_loop(grid)
    rows: list[dict[str, Any]] = []
    final = loop.run([problem().w0.copy()], lambda flush, facts: rows.append(dict(facts)))
    return final[0], strategy, rows


@pytest.mark.parametrize("codec", ["q8", "topk:0.5+q8"])
def test_c_stays_the_mean_of_the_accounted_c_i_and_bytes_up_is_the_codecs(
        tmp_path: Path, codec: str) -> None:
    w, strategy, rows = run(tmp_path / codec, codec)
    accounted = strategy.accounted or {}
    assert set(accounted) == set(range(N))
    c_i = [StateDir(tmp_path / codec, EXPERIMENT, cid).load_version(
        accounted[cid], [np.zeros(DIM)])[C_LOCAL][0].astype(np.float64) for cid in range(N)]
    np.testing.assert_allclose(strategy.state.c[0], np.mean(c_i, axis=0), rtol=1e-5,
                               atol=1e-6)
    assert np.abs(strategy.state.c[0]).max() > 1e-2  # c really moved
    payload = Compression.parse(codec).wire_bytes([(DIM,)])  # type: ignore[union-attr]
    assert [r["bytes-up"] for r in rows] == [payload * 2 * 2] * len(rows)  # 2 channels x 2
    w_off, _, plain = run(tmp_path / "off", "off")
    assert [r["bytes-up"] for r in plain] == [4 * DIM * 2 * 2] * len(plain)
    gap = np.abs(w - w_off).max() / np.abs(w_off).max()
    assert 0.0 < gap < 0.2, gap  # lossy, and still the same run's neighbourhood
