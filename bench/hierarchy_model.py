"""Round time and bytes of a federation past one SuperLink: regional SuperLinks under a parent.

Pure arithmetic from measured per-node figures (docs/scaling.md, "Past one SuperLink"), no
Flower process. One SuperLink serves the nodes connected to it while idle (each pull or
heartbeat costs it CPU) and, in a round, works through its sampled nodes one after another
(about a dozen requests each, on one Python process: seconds per node-round). So a region
holds at most as many devices as its idle share of a core allows, and parent tiers go above
the regions, each link with at most as many children as the round budget allows. Each
regional ServerApp is one client of its parent: the parent's round costs one node-round per
child link, and carries one model down and one partial sum up per child, not per device.
Printed per case: the tree with the shortest round, and the flattest (one tier of parents
with as many children as the budget allows).

    .venv/bin/python -m bench.hierarchy_model
    .venv/bin/python -m bench.hierarchy_model --devices 100000 1000000 --sampled 0.01 \
        --link-s-per-node 0.09 --pull-s 0.0021
"""

from __future__ import annotations

import argparse
import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class Figures:
    """Per-node costs of one SuperLink and of one device's round (measured defaults:
    the in-memory state, docs/benchmarks.md "A SuperLink with many nodes"; the FedInit
    message, bench/wire_bytes.py; the cellular link's round, bench/link_rounds.py)."""

    link_s_per_node: float = 0.09
    """A SuperLink's seconds per sampled node per round (1000 fake nodes: 94 s a round)."""
    pull_s: float = 0.0021
    """A SuperLink's CPU seconds per idle pull or heartbeat (0.021% of a core per node
    pulling every 10 s)."""
    idle_poll_s: float = 10.0
    """How often an idle node pulls (``--idle-poll``)."""
    idle_share: float = 0.5
    """The share of a link's core its idle nodes may take (the rest serves rounds)."""
    round_budget_s: float = 60.0
    """The most seconds of node-rounds one link may spend in a round."""
    down_bytes: int = 218_308
    """A train message, serialized (FedInit, the default CNN)."""
    up_bytes: int = 218_488
    """A reply, serialized; a region's partial sum up to its parent is taken as one too."""
    device_s: float = 9.6
    """A device's own round: download, training, upload (the cellular scenario: 9.57 s)."""
    tier_s: float = 0.33
    """What a tier of links adds to a round beyond its node-rounds: one deployment round's
    overhead over simulation (3 nodes, in memory: 0.33 s; SQLite: 0.64 s)."""

    @property
    def idle_capacity(self) -> int:
        """Devices one link keeps connected within its idle share of a core."""
        return int(self.idle_share * self.idle_poll_s / self.pull_s)

    @property
    def max_fan_out(self) -> int:
        """Child links one parent serves in a round within the round budget (>= 2)."""
        return max(2, int(self.round_budget_s / self.link_s_per_node))


@dataclasses.dataclass(frozen=True)
class Plan:
    """One federation's tree and its round."""

    devices: int
    sampled: int
    regions: int
    tiers: tuple[int, ...]
    """Links per tier above the regions, bottom up (empty: one SuperLink)."""
    fan_out: int
    region_sampled: int
    """Sampled devices of the busiest region."""
    round_s: float
    top_bytes: int
    """Bytes per round through the top link (down + up)."""
    region_bytes: int
    """Bytes per round through the busiest region's link (its devices and its parent)."""
    total_bytes: int
    """Bytes per round over every edge of the tree."""
    flat_round_s: float
    """The same round on one SuperLink."""
    flat_idle_cores: float
    """The cores one SuperLink's idle devices would need (over idle_share: not servable)."""


def plan(devices: int, sampled: int, f: Figures, fan_out: int | None = None) -> Plan:
    """The tree whose links stay within ``f``'s idle and round budgets: as few regions as
    the idle budget allows, and above them the fan-out (``fan_out``, else the one of 2 to
    ``max_fan_out`` with the shortest round, the larger on a tie) of the parent tiers."""
    regions = max(1, math.ceil(devices / f.idle_capacity),
                  math.ceil(sampled * f.link_s_per_node / f.round_budget_s))
    if fan_out is None:
        choices = [tree(devices, sampled, regions, k, f) for k in range(2, f.max_fan_out + 1)]
        return min(reversed(choices), key=lambda p: p.round_s)
    return tree(devices, sampled, regions, fan_out, f)


def tree(devices: int, sampled: int, regions: int, fan_out: int, f: Figures) -> Plan:
    """``regions`` regional links under tiers of ``fan_out`` children a link: the round is
    a device's round, the busiest region's node-rounds, then each tier's (its busiest link's
    children, one node-round each, and ``tier_s``)."""
    per_message = f.down_bytes + f.up_bytes
    region_sampled = math.ceil(sampled / regions)
    round_s = f.device_s + region_sampled * f.link_s_per_node
    tiers: list[int] = []
    count = regions
    link_edges = 0  # edges between links: one model down, one partial sum up each
    top_children = sampled  # the top link's children: devices, unless there are tiers
    while count > 1:
        links = math.ceil(count / fan_out)
        children = math.ceil(count / links)
        round_s += children * f.link_s_per_node + f.tier_s
        link_edges += count
        top_children = count
        tiers.append(links)
        count = links
    return Plan(
        devices=devices, sampled=sampled, regions=regions, tiers=tuple(tiers), fan_out=fan_out,
        region_sampled=region_sampled, round_s=round_s,
        top_bytes=top_children * per_message,
        region_bytes=(region_sampled + (regions > 1)) * per_message,
        total_bytes=(sampled + link_edges) * per_message,
        flat_round_s=f.device_s + sampled * f.link_s_per_node,
        flat_idle_cores=devices * f.pull_s / f.idle_poll_s)


def table(rows: list[tuple[str, Plan]]) -> str:
    """The plans as a markdown table."""
    out = ["| state | devices | sampled/round | regions | fan-out: links per tier above | "
           "links | busiest region's sampled | round s | one SuperLink: round s / idle cores | "
           "MB top link | MB busiest region | MB all edges |",
           "|---|---:|---:|---:|---|---:|---:|---:|---|---:|---:|---:|"]
    for label, p in rows:
        tiers = " / ".join(str(t) for t in p.tiers) or "-"
        out.append(
            f"| {label} | {p.devices:,} | {p.sampled:,} | {p.regions:,} | "
            f"{p.fan_out}: {tiers} | {p.regions + sum(p.tiers):,} | {p.region_sampled:,} | "
            f"{p.round_s:.1f} | {p.flat_round_s:,.0f} / {p.flat_idle_cores:.1f} | "
            f"{p.top_bytes / 1e6:,.1f} | {p.region_bytes / 1e6:,.1f} | "
            f"{p.total_bytes / 1e6:,.0f} |")
    return "\n".join(out)


STATES = {"memory": Figures(),
          "SQLite": Figures(link_s_per_node=0.39, pull_s=0.0041, tier_s=0.64)}
"""The measured figures by SuperLink state: in memory; SQLite (the default): 0.39 s per
node-round, 0.136% of a core per node pulling every 3 s (4.1 ms a pull), 0.64 s of
deployment overhead a round."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--sampled", type=float, nargs="+", default=[0.01],
                    help="devices sampled per round, as a fraction of the fleet")
    ap.add_argument("--link-s-per-node", type=float, default=None,
                    help="override the states' seconds per node-round")
    ap.add_argument("--pull-s", type=float, default=None,
                    help="override the states' CPU seconds per idle pull")
    ap.add_argument("--fan-out", type=int, default=None,
                    help="child links per parent (default: the shortest round's)")
    args = ap.parse_args()
    rows = []
    for label, base in STATES.items():
        f = dataclasses.replace(
            base, link_s_per_node=args.link_s_per_node or base.link_s_per_node,
            pull_s=args.pull_s or base.pull_s)
        for n in args.devices:
            for q in args.sampled:
                m = max(1, round(n * q))
                rows.append((label, plan(n, m, f, args.fan_out)))
                if args.fan_out is None:  # and the flattest tree the budget allows
                    rows.append((label, plan(n, m, f, f.max_fan_out)))
    print(table(rows))


if __name__ == "__main__":
    main()
