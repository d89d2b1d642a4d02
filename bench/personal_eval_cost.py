"""The cost of personalized evaluation per round, beside a round without it, in one run.

    .venv/bin/python -m bench.personal_eval_cost                  # the default experiment
    .venv/bin/python -m bench.personal_eval_cost personal-eval-clients=0 num-clients=50

Runs the default experiment (or it with ``key=value`` overrides) for ``--rounds`` rounds
in-process (the real round loop and ClientApp handlers, ``fedinit/cli/inprocess_grid.py``) with
``personal-eval-every=2``, so odd rounds have no personalized evaluation and even rounds have
one, then prints per round: seconds, the personalized evaluation's own seconds, and the
messages exchanged (train and evaluate, each counted out and back), and the mean of each kind
of round. Round 1 (data loading) is left out of the means.
"""

from __future__ import annotations

import statistics
import sys

from bench.cost_runs import cost_args, cost_run


def main(argv: list[str] | None = None) -> int:
    rounds, overrides = cost_args(__doc__, 7, argv)
    run = cost_run({"num-server-rounds": rounds, "personal-eval-every": 2, **overrides})
    cfg, rows = run.cfg, run.rows
    print(f"\n{cfg.num_clients} clients, {cfg.clients_per_round} trained per round, "
          f"personalized evaluation of {cfg.eval.personal_eval_clients or cfg.num_clients} "
          f"clients ({cfg.eval.finetune_epochs} fine-tuning epoch) every 2nd round, "
          f"train-limit={cfg.data.train_limit}, local-test-fraction={cfg.data.local_test_fraction}")
    print(f"{'round':>5} {'personal':>8} {'round s':>8} {'of it personal s':>16} "
          f"{'train msgs':>10} {'eval msgs':>9}")
    kinds: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    for r in rows:
        has = r.get("local-eval-seconds") is not None
        train_msgs = 2 * (r["num-replies"] + r["num-rejected"] + r["num-missing"])
        eval_msgs = r.get("local-eval-messages") or 0
        print(f"{r['round']:>5} {'yes' if has else 'no':>8} {r['round-seconds']:>8.2f} "
              f"{r.get('local-eval-seconds') or 0.0:>16.2f} {train_msgs:>10} {eval_msgs:>9}")
        if r["round"] > 1:
            kinds[has].append({"s": r["round-seconds"], "p": r.get("local-eval-seconds") or 0.0,
                               "m": train_msgs + eval_msgs})
    for has, label in ((False, "without"), (True, "with")):
        if kinds[has]:
            print(f"mean round {label:>7} personalized evaluation: "
                  f"{statistics.mean(k['s'] for k in kinds[has]):.2f} s "
                  f"({statistics.mean(k['p'] for k in kinds[has]):.2f} s of it), "
                  f"{statistics.mean(k['m'] for k in kinds[has]):.0f} messages")
    return 0


if __name__ == "__main__":
    sys.exit(main())
