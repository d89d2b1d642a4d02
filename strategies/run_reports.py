"""A method's report files in the run directory (``fedinit.methods.method.ReportFiles``).

FedRelax writes ``graph.json`` and ``graph.png`` through it, clustered FL ``clusters.jsonl``:
the methods say what to report, this writes it (atomically, through ``fedinit.store.files``) and
draws it (matplotlib stays out of ``fedinit/methods/``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedinit.store.files import atomic_write_text


class RunReports:
    """Report files of one run, under ``run_dir``."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir

    def replace_text(self, name: str, text: str) -> None:
        atomic_write_text(self.run_dir / name, text)

    def append_line(self, name: str, line: str) -> None:
        with (self.run_dir / name).open("a") as f:
            f.write(line + "\n")

    def draw_graph(self, name: str, graph: list[np.ndarray], num_clients: int,
                   title: str) -> None:
        draw_graph(graph, num_clients, self.run_dir / name, title)


def draw_graph(graph: list[np.ndarray], num_clients: int, path: Path, title: str) -> None:
    """The graph as a PNG: clients on a circle, edges as lines (width ~ weight)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    angle = 2 * np.pi * np.arange(num_clients) / max(num_clients, 1)
    x, y = np.cos(angle), np.sin(angle)
    fig, ax = plt.subplots(figsize=(6, 6))
    from matplotlib.collections import LineCollection

    top = float(graph[1].max()) if len(graph[1]) else 1.0
    at = np.stack([x, y], axis=1)
    ends = np.stack([at[graph[0][:, 0]], at[graph[0][:, 1]]], axis=1)
    ax.add_collection(LineCollection(list(ends), colors="0.5", zorder=1,
                                     linewidths=list(0.3 + 1.5 * graph[1] / top)))
    ax.scatter(x, y, color="tab:blue", s=12, zorder=2)
    ax.set_title(title)
    ax.set_axis_off()
    ax.set_aspect("equal")
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
