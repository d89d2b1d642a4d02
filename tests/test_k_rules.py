"""fedinit/scripts/k_rules.py: the candidate rules for K pick what their definitions say, checked on
silhouettes written out by hand (rotation seed 2's and a flat Dir-0.1-like profile)."""

from __future__ import annotations

from fedinit.scripts.k_rules import argmax_rule, within_rule

SEED2 = {2: 0.550, 3: 0.521, 4: 0.527, 5: 0.485, 6: 0.352, 7: 0.328}
FLAT = {2: 0.21, 3: 0.18, 4: 0.26, 5: 0.34, 6: 0.34, 7: 0.33}


def test_argmax_takes_the_best_k_and_the_smaller_on_ties() -> None:
    assert argmax_rule(0.2)(SEED2) == 2
    assert argmax_rule(0.2)(FLAT) == 5  # 0.34 at k = 5 and 6: the smaller
    assert argmax_rule(0.4)(FLAT) == 1  # best 0.34 below the floor
    assert argmax_rule(0.2)({}) == 1


def test_within_takes_the_largest_k_near_the_best() -> None:
    # 0.95 x 0.550 = 0.5225: k = 4 (0.527) is in, k = 5 (0.485) is out
    assert within_rule(0.2, 0.05)(SEED2) == 4
    # 0.90 x 0.550 = 0.495: still k = 4, 0.485 is out
    assert within_rule(0.2, 0.10)(SEED2) == 4
    # 0.85 x 0.550 = 0.4675: k = 5 comes in
    assert within_rule(0.2, 0.15)(SEED2) == 5
    assert within_rule(0.2, 0.05)(FLAT) == 7  # 0.95 x 0.34 = 0.323: k = 7's 0.33 is in
    assert within_rule(0.56, 0.05)(SEED2) == 1
