"""fedinit/scripts/ri_gain.py: pairs by seed, gains of the means, and the spread verdict by hand."""

from __future__ import annotations

from fedinit.scripts.ri_gain import paired, table, verdict


def row(method: str, beta: float, seed: int, acc: float, status: str = "done",
        alpha: str = "0.1") -> dict[str, str]:
    return {"method": method, "beta": str(beta), "seed": str(seed), "dirichlet-alpha": alpha,
            "status": status, "smoothed-peak-acc": str(acc / 100)}


def test_only_seeds_finished_with_and_without_ri_are_paired() -> None:
    rows = [row("fedavg", 0, 0, 70), row("fedavg", 0.1, 0, 74), row("fedavg", 0, 1, 71),
            row("fedavg", 0.1, 1, 75, status="pending"), row("fedavg", 0.1, 2, 76)]
    got = paired(rows)
    assert set(got) == {("fedavg", "0.1")}
    assert list(got[("fedavg", "0.1")]) == [0]
    off, on = got[("fedavg", "0.1")][0]
    assert abs(off - 70) < 1e-9 and abs(on - 74) < 1e-9


def test_the_verdict_needs_separate_bands_and_one_sign() -> None:
    assert verdict(3.0, 0.5, 1.0, [2.5, 3.5, 3.0]) == "outside the spread"
    assert verdict(3.0, 2.0, 1.5, [2.5, 3.5, 3.0]) == "within the spread"  # bands overlap
    assert verdict(1.0, 0.1, 0.1, [2.0, -0.5, 1.5]) == "within the spread"  # a seed disagrees
    assert verdict(-2.0, 0.2, 0.3, [-2.1, -1.9]) == "outside the spread (RI hurts)"
    assert verdict(3.0, 0.0, 0.0, [3.0]) == "one seed: no spread"


def test_the_row_holds_the_means_the_std_and_each_seed_s_gain() -> None:
    rows = [row("scaffold", 0, s, a) for s, a in enumerate([70, 72, 74])]
    rows += [row("scaffold", 0.1, s, a) for s, a in enumerate([71, 72, 76])]
    (line,) = table(paired(rows), ["scaffold"])[2:]
    # means 72 and 73, sample std 2.00 and 2.65 (by hand), gains +1, 0, +2
    # paired t: gains 1, 0, 2 have mean 1 and std 1, t = 1 / (1 / sqrt 3) = 1.732 on 2
    # degrees of freedom; two-sided p = 0.2254 (t tables)
    assert line == ("| scaffold | 0.1 | 3 | 72.00 ± 2.00 | 73.00 ± 2.65 | +1.00 | "
                    "+1.00, +0.00, +2.00 | within the spread | 0.225 |")


def test_settings_of_several_columns_are_kept_apart() -> None:
    rows = [row("fedavg", b, 0, a, alpha=al) for b, a, al in
            [(0, 70, "0.1"), (0.1, 74, "0.1"), (0, 77, "0.6"), (0.1, 80, "0.6")]]
    for r in rows:
        r["num-clients"] = "200"
    got = paired(rows, "num-clients,dirichlet-alpha")
    assert set(got) == {("fedavg", "200 0.1"), ("fedavg", "200 0.6")}
    assert abs(got[("fedavg", "200 0.6")][0][1] - 80) < 1e-9
