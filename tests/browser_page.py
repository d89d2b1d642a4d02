"""The browser tests' one way to read the fleet page: fedinit/scripts/headless.py's tab, with
chromium
installed by apt when missing (as root) and the test skipped without Playwright."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from fedinit.scripts.headless import CHROMIUM, LocalPage, open_browser

FLEET_LOOK = """() => {
  const t = document.getElementById('fleet');
  if (document.readyState !== 'complete' || !t || t.tagName !== 'TABLE') return {loaded: false};
  const head = [...t.rows[0].cells].map(c => c.textContent);
  const nodes = {};
  for (const tr of t.querySelectorAll('tr[data-node]')) {
    const cells = [...tr.cells].map(c => c.textContent);
    nodes[tr.dataset.node] = {...Object.fromEntries(head.map((h, i) => [h, cells[i]])),
                              state: tr.className, connected: tr.dataset.connected};
  }
  return {loaded: true, nodes,
          points: document.querySelectorAll('svg[data-key="test-acc"] circle.pt').length};
}"""
"""What a test reads off a run's page, in one evaluation of one loaded document: each fleet
row (every cell by its column's heading, then ``state`` and ``connected`` from the row's
class and data-connected: yes / no / -, not the cell's "no (last 12 s ago)") and the accuracy
curve's points."""


def chromium() -> str:
    """Debian's chromium, installed with apt (as root) when missing."""
    if not Path(CHROMIUM).exists():
        if os.geteuid() != 0 or shutil.which("apt-get") is None:
            pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium (as root)")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], env=env, check=False, capture_output=True)
        proc = subprocess.run(
            ["apt-get", "install", "-y", "-qq", "chromium"],
            env=env,
            check=False,
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0 or not Path(CHROMIUM).exists():
            pytest.fail(f"apt-get install chromium failed: {proc.stderr[-500:]}")
    return CHROMIUM


@contextmanager
def browse(width: int = 1500, height: int = 900) -> Iterator[LocalPage]:
    """A headless chromium tab for a test (skipped without Playwright)."""
    pytest.importorskip(
        "playwright.sync_api", reason="pip install playwright (pyproject's dev extras)"
    )
    chromium()
    with open_browser(width, height) as tab:
        yield tab


def count(cell: object) -> int:
    """A page cell's count ("3", "1 (client error: ...)", "-")."""
    head = str(cell or "-").split(" ", 1)[0]
    return int(head) if head.isdigit() else 0
