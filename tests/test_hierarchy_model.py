"""bench/hierarchy_model.py's arithmetic against a federation worked out by hand.

Figures chosen to be exact in binary: a link spends 0.125 s per node-round and 1/512 s per
idle pull; idle nodes pull every 10 s and may take half a core, so a region holds
0.5 * 10 * 512 = 2,560 devices; a link's round budget is 5 s, so at most 40 children.
"""

from __future__ import annotations

import pytest

from bench.hierarchy_model import Figures, plan

F = Figures(link_s_per_node=0.125, pull_s=1 / 512, idle_poll_s=10.0, idle_share=0.5,
            round_budget_s=5.0, down_bytes=100, up_bytes=50, device_s=10.0, tier_s=0.5)


def test_capacities() -> None:
    assert (F.idle_capacity, F.max_fan_out) == (2560, 40)


def test_regions_under_one_parent_by_hand() -> None:
    # 102,400 devices / 2,560 = 40 regions (the round budget asks only 1000 * 0.125 / 5 =
    # 25); 1000 sampled: 25 a region, 3.125 s; one parent with 40 children: 5 s + 0.5 s
    p = plan(102_400, 1000, F, fan_out=40)
    assert (p.regions, p.tiers, p.region_sampled) == (40, (1,), 25)
    assert p.round_s == pytest.approx(10 + 3.125 + 5.5)
    # bytes (150 a message and its reply): the parent 40 x 150; a region 25 devices and
    # its parent edge; every edge: 1000 device edges and 40 region edges
    assert (p.top_bytes, p.region_bytes, p.total_bytes) == (6_000, 3_900, 156_000)
    # one SuperLink: 1000 node-rounds of 0.125 s; its idle devices 102,400 / 5,120 cores
    assert p.flat_round_s == pytest.approx(135.0)
    assert p.flat_idle_cores == pytest.approx(20.0)


def test_the_shortest_round_is_a_deeper_tree() -> None:
    # fan-out 9 (7 and 8 tie; the larger is kept): 40 regions -> 5 links of 8 children
    # (1 s + 0.5) -> 1 link of 5 (0.625 s + 0.5): 2.625 s of tiers against 5.5 s flat
    p = plan(102_400, 1000, F)
    assert (p.fan_out, p.tiers) == (9, (5, 1))
    assert p.round_s == pytest.approx(10 + 3.125 + 1.5 + 1.125)
    assert (p.top_bytes, p.total_bytes) == (5 * 150, (1000 + 40 + 5) * 150)


def test_a_small_fleet_stays_on_one_superlink() -> None:
    p = plan(1000, 10, F)
    assert (p.regions, p.tiers) == (1, ())
    assert p.round_s == pytest.approx(p.flat_round_s) == pytest.approx(11.25)
    assert p.top_bytes == p.region_bytes == p.total_bytes == 1_500


def test_the_round_budget_adds_regions_when_few_devices_are_sampled_often() -> None:
    # 2,000 devices fit one region's idle budget, but 800 node-rounds are 100 s: 20 regions
    assert plan(2000, 800, F, fan_out=40).regions == 20
