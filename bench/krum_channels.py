"""How often Krum, Multi-Krum and Bulyan keep an attacker that pairs a chosen model move with a
chosen SCAFFOLD Delta_c, under three selection rules, on synthetic rounds with fixed seeds.

Each round: n = 10 replies; honest moves u + noise, honest Delta_c 4 (v + noise) (u, v unit
directions in d = 50, noise of ``NOISE`` times the signal's energy: honest moves have cosine
about 0.5). Reply 0 attacks: its move is its honest one times ``MOVES[m]`` (flipped: -1,
zero: 0) and its Delta_c is one of ``DELTA_CS``:

- ``random``: a random direction at the honest median Delta_c norm;
- ``honest``: its own honest Delta_c (with move x1 the reply is honest: the control cell);
- ``mean``: the mean of the honest Delta_c (a perfect estimate);
- ``best``: the attacker's best response, the Delta_c with the lowest Krum score given the
  others (the centroid of its n - f - 2 nearest honest Delta_c, best of several starts);
- ``x5``: its honest Delta_c times 5 (what the Delta_c screen is for).

Rules: ``old``, the rule before issue 42 (a reply ranked by its worst per-channel Krum score
over the channel's median, ``fedinit.methods.robust.channel_scores``); ``new``,
``fedinit.methods.robust.select`` (the move alone selects; a Delta_c over ``SCREEN`` x the median
score is screened out of c, ``unaccounted``); ``move alone``, Krum on the move (the bench
checks that ``new`` keeps exactly its set in every round). Krum and Multi-Krum with f = 2,
Bulyan with f = 1 (the defence table's). Printed per cell: the rounds in which the attacker
was kept (its move combined), in which its Delta_c entered c under the new rule, and Krum's
honest progress: the mean over rounds of <combined move, u> over that of the honest
replies' plain mean.

  python -m bench.krum_channels                 # the grid of docs/faults.md (200 rounds)
  python -m bench.krum_channels --rounds 50     # quicker
  python -m bench.krum_channels --noise 0.5     # honest replies closer together
"""

from __future__ import annotations

import argparse

import numpy as np

from fedinit.methods.robust import channel_scores, combine, select, unaccounted

N, DIM, DC_SCALE, NOISE = 10, 50, 4.0, 1.0
F = {"krum": 2, "multi-krum": 2, "bulyan": 1}
MOVES: dict[str, float] = {"x3": 3.0, "x1": 1.0, "x0.3": 0.3, "x0.1": 0.1, "flipped": -1.0,
                           "zero": 0.0}
DELTA_CS = ("random", "honest", "mean", "best", "x5")
Joint = list[list[np.ndarray]]
"""One round: per reply [move, Delta_c], each one array (two channels)."""


def best_response(others: np.ndarray, k: int, starts: int = 4) -> np.ndarray:
    """The point with the lowest sum of squared distances to its k nearest rows of
    ``others``: from the mean and the first ``starts`` rows, each moved to the centroid of its
    k nearest until that set stops changing; the best end point."""
    def cost(x: np.ndarray) -> tuple[float, np.ndarray]:
        d = np.sum((others - x) ** 2, axis=1)
        near = np.sort(np.argsort(d, kind="stable")[:k])
        return float(d[near].sum()), near

    best, best_cost = others.mean(axis=0), np.inf
    for x in [others.mean(axis=0), *others[:starts]]:
        near = np.array([], dtype=int)
        for _ in range(20):
            _, now = cost(x)
            if np.array_equal(now, near):
                break
            near, x = now, others[now].mean(axis=0)
        c, _ = cost(x)
        if c < best_cost:
            best, best_cost = x, c
    return best


def synthetic_rounds(rounds: int, seed: int, move: float = -1.0, delta_c: str = "mean",
                     n: int = N, noise: float = NOISE, f: int = 2
                     ) -> tuple[list[Joint], np.ndarray]:
    """``rounds`` rounds of n replies, reply 0 the attacker (module docstring), and u. With
    move -1 and ``mean`` these are issue 35's rounds (the draws are the same)."""
    if delta_c not in DELTA_CS:
        raise ValueError(f"delta_c={delta_c!r} is not allowed; allowed: {', '.join(DELTA_CS)}")
    rng = np.random.default_rng(seed)
    u, v = rng.standard_normal(DIM), rng.standard_normal(DIM)
    u, v = u / np.linalg.norm(u), v / np.linalg.norm(v)
    sigma = np.sqrt(noise / DIM)
    out = []
    for _ in range(rounds):
        moves = u + sigma * rng.standard_normal((n, DIM))
        dcs = DC_SCALE * (v + sigma * rng.standard_normal((n, DIM)))
        moves[0] = move * moves[0]
        if delta_c == "mean":
            dcs[0] = dcs[1:].mean(axis=0)
        elif delta_c == "random":
            g = rng.standard_normal(DIM)
            dcs[0] = g / np.linalg.norm(g) * np.median(np.linalg.norm(dcs[1:], axis=1))
        elif delta_c == "best":
            dcs[0] = best_response(dcs[1:], max(1, n - f - 2))
        elif delta_c == "x5":
            dcs[0] = 5.0 * dcs[0]
        out.append([[moves[i], dcs[i]] for i in range(n)])
    return out, u


def old_select(joint: Joint, kind: str, f: int) -> list[int]:
    """The rule before issue 42: the lowest worst per-channel normalised Krum scores."""
    n = len(joint)
    keep = {"krum": 1, "multi-krum": n - f, "bulyan": n - 2 * f}[kind]
    worst = channel_scores(joint, 2, f).max(axis=1)
    return sorted(int(i) for i in np.argsort(worst, kind="stable")[:keep])


def progress(joint: Joint, chosen: list[int], kind: str, f: int, u: np.ndarray) -> float:
    """<the combined move of the selection, u>."""
    out = combine([[joint[i][0]] for i in chosen], [1.0] * len(chosen), kind, 0.0, f)[0]
    return float(np.dot(out, u))


def cell(rounds: int, seed: int, move: float, delta_c: str, noise: float = NOISE
         ) -> dict[str, float]:
    """Per kind: the rounds in which the attacker was kept under the old rule, the new rule
    and the move alone, and in which its Delta_c entered c under the new rule; Krum's honest
    progress under the old and the new rule."""
    joints, u = synthetic_rounds(rounds, seed, move, delta_c, noise=noise)
    honest = float(np.mean([np.dot(np.mean([v[0] for v in j[1:]], axis=0), u)
                            for j in joints]))
    out: dict[str, float] = {}
    for kind, f in F.items():
        old = [old_select(j, kind, f) for j in joints]
        new = [select(j, kind, f, channels=2) or [] for j in joints]
        alone = [select([[v[0]] for v in j], kind, f, channels=1) or [] for j in joints]
        if new != alone:
            raise AssertionError(f"{kind}: the new selection is not the move-alone one")
        out[f"{kind} old"] = sum(0 in s for s in old)
        out[f"{kind} new"] = sum(0 in s for s in new)
        out[f"{kind} move"] = sum(0 in s for s in alone)
        out[f"{kind} dc"] = sum(0 in s and 0 not in unaccounted(j, s, kind, f, channels=2)
                                for j, s in zip(joints, new, strict=True))
        if kind == "krum":
            for rule, sets in (("old", old), ("new", new)):
                out[f"progress {rule}"] = float(np.mean(
                    [progress(j, s, kind, f, u) for j, s in zip(joints, sets, strict=True)])
                    ) / honest
    return out


COLUMNS = ("old", "new", "dc")
"""Per kind: kept by the old rule, by the new one (= the move alone, checked), and the new
rule's rounds with the attacker's Delta_c in c."""


def table(rounds: int, seed: int, noise: float = NOISE) -> str:
    """The markdown grid: a row per (move, Delta_c)."""
    names = {"old": "old", "new": "new = move alone", "dc": "new, Delta_c in c"}
    head = ["move", "Delta_c"] + [f"{k} {names[c]}" for k in F for c in COLUMNS] + [
        "Krum progress old", "Krum progress new"]
    lines = ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(head) - 2)]
    for m, scale in MOVES.items():
        for dc in DELTA_CS:
            c = cell(rounds, seed, scale, dc, noise)
            picks = [f"{int(c[f'{k} {col}'])}" for k in F for col in COLUMNS]
            prog = [f"{c[f'progress {r}']:.2f}" for r in ("old", "new")]
            lines.append("| " + " | ".join([m, dc, *picks, *prog]) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--noise", type=float, default=NOISE, help="honest noise / signal energy")
    args = ap.parse_args()
    print(f"{args.rounds} rounds per cell, seed {args.seed}, noise {args.noise}; rounds in "
          "which the attacker was kept:")
    print(table(args.rounds, args.seed, args.noise))


if __name__ == "__main__":
    main()
