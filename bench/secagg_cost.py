"""Secure aggregation's cost beside the plain round: bytes and seconds per round, in process.

N clients (3 / 10 / 50) upload a model-sized vector (the default CNN's arrays) through the
SecAgg+ core (``secure_aggregation``); every message is a Flower ConfigRecord and its bytes
are what Flower serializes (``ConfigRecord.deflate``, as the plain upload's ArrayRecord).
Seconds are wall time on this machine: all clients' steps run one after another, so
"client s" is the mean over clients of one client's four steps, "server s" the driver's,
"plain s" the plain round's server work (summing the survivors' float arrays). "up" is per
client that uploaded a masked vector (all four stages' replies), "down" per sampled client.
Each size runs once with no dropout and once with the most clients dropped after key sharing
(adjacent on the ring, the worst place), the most the threshold survives: min(k, n) - t.

    PYTHONPATH=$PWD .venv/bin/python -m bench.secagg_cost [--sizes 3,10,50] [--bits 16]

With ``--deployed``: 4 SuperNodes over TLS instead, plain and secagg+ rounds side by side
(``bench.secagg_deployed``). With ``--signed``: each size with unsigned and with signed keys
(every client signs with its device key and verifies its neighbours', ``signing``), side by
side, and the ratios (bytes up and down, client and server seconds); signed rounds run the
consistency check (one more exchange: U3 down, a signature up, and the unmask requests
carry the survivors' signatures), whose own share is printed beside them.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric import ec
from flwr.app import ArrayRecord, ConfigRecord

from bench import secagg_deployed
from fedinit.secure_aggregation import SecAggClient, SecAggParams, SecAggServer
from fedinit.secure_aggregation.signing import KeyTrust
from fedinit.task.models import build_model, get_weights
from testbeds.lsq_problem import serialized_bytes


def graph_for(n: int) -> tuple[int, int]:
    """(k, t): the complete graph up to 10 clients, a SecAgg+ ring of 2*ceil(log2 n)+1 above."""
    k = n + 1 - n % 2 if n <= 10 else 2 * int(np.ceil(np.log2(n))) + 1
    return k, k // 2 + 1


def wire_bytes(msg: Mapping[str, Any]) -> int:
    return len(ConfigRecord(dict(msg)).deflate())


def one_round(n: int, weights: list[np.ndarray], bits: int, dropped: int,
              signed: bool = False) -> dict[str, float]:
    k, t = graph_for(n)
    params = SecAggParams(threshold=t, num_shares=k, clip=1.0, bits=bits)
    ids = list(range(1, n + 1))
    rng = np.random.default_rng(0)
    vectors = {i: [rng.uniform(-0.1, 0.1, w.shape) for w in weights] for i in ids}
    gone = set(ids[n // 2: n // 2 + dropped])
    server = SecAggServer(params, ids, [w.shape for w in weights])
    trust: dict[int, KeyTrust] = {}
    if signed:  # each device's key, and every device holding everyone's public key
        keys = {i: ec.generate_private_key(ec.SECP384R1()) for i in ids}
        peers = {i: k.public_key() for i, k in keys.items()}
        trust = {i: KeyTrust(keys[i], peers) for i in ids}
    clients = {i: SecAggClient(i, trust.get(i), 1, 1) for i in ids}
    down = up = 0
    client_s = server_s = 0.0
    stage: dict[str, float] = {}  # per stage: bytes down, up and client seconds

    def ask(msgs: Mapping[int, Mapping[str, Any]], absent: set[int],
            name: str = "") -> dict[int, Any]:
        nonlocal down, up, client_s
        replies = {}
        for i, m in msgs.items():
            down += wire_bytes(m)
            stage[f"{name}_down"] = stage.get(f"{name}_down", 0) + wire_bytes(m)
            if i in absent:
                continue
            start = time.perf_counter()
            replies[i] = clients[i].handle(m, vectors[i])
            took = time.perf_counter() - start
            client_s += took
            stage[f"{name}_client_s"] = stage.get(f"{name}_client_s", 0.0) + took
            up += wire_bytes(replies[i])
            stage[f"{name}_up"] = stage.get(f"{name}_up", 0) + wire_bytes(replies[i])
        return replies

    def drive(step: Any, *args: Any) -> Any:
        nonlocal server_s
        start = time.perf_counter()
        out = step(*args)
        server_s += time.perf_counter() - start
        return out

    replies = ask(drive(server.setup_messages), set())
    replies = ask(drive(server.share_keys_messages, replies), set())
    replies = ask(drive(server.collect_messages, replies), gone)
    if server.checks:  # signed keys: the consistency check before unmask
        replies = ask(drive(server.check_messages, replies), set(), "check")
        replies = ask(drive(server.unmask_after_check, replies), set(), "unmask")
    else:
        replies = ask(drive(server.unmask_messages, replies), set(), "unmask")
    total = drive(server.aggregate, replies)
    survivors = [i for i in ids if i not in gone]
    start = time.perf_counter()
    plain = [sum(vectors[i][a] for i in survivors) for a in range(len(weights))]
    plain_s = time.perf_counter() - start
    err = max(float(np.abs(g - p).max()) for g, p in zip(total, plain, strict=True))
    assert err < params.sum_error_bound(len(survivors)), (err, n)
    return {"k": k, "t": t, "dropped": dropped, "up": up / len(survivors), "down": down / n,
            "plain_s": plain_s,
            "client_s": client_s / n, "server_s": server_s, "err": err,
            "bound": params.sum_error_bound(len(survivors)),
            **{key: value / n for key, value in stage.items() if key.startswith(("check",
                                                                                "unmask"))}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="3,10,50")
    parser.add_argument("--bits", type=int, default=16)
    parser.add_argument("--signed", action="store_true",
                        help="unsigned and signed keys side by side, with their ratios")
    parser.add_argument("--deployed", action="store_true",
                        help="4 TLS SuperNodes, plain vs secagg+: bench.secagg_deployed's "
                        "options (--rounds, --train-limit, --pairs, --base-port) apply")
    args, rest = parser.parse_known_args()
    if args.deployed:
        secagg_deployed.cli(rest)
        return
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    weights = get_weights(build_model("cnn", 10, 1, seed=0))
    if args.signed:
        signed_side_by_side(weights, [int(s) for s in args.sizes.split(",")], args.bits)
        return
    count = sum(w.size for w in weights)
    plain_up = serialized_bytes(ArrayRecord(weights))
    print(f"default CNN: {count} parameters; plain upload {plain_up} B per client "
          f"(ArrayRecord, float32); bits={args.bits}, modulus 2^32")
    print(f"{'n':>3} {'k':>3} {'t':>3} {'drop':>4} {'up B/client':>12} {'x plain':>7} "
          f"{'down B/client':>13} {'client s':>8} {'server s':>8} {'plain s':>8} {'max err':>9} "
          f"{'bound':>9}")
    for n in (int(s) for s in args.sizes.split(",")):
        k, t = graph_for(n)
        for dropped in (0, min(k, n) - t):
            r = one_round(n, weights, args.bits, dropped)
            print(f"{n:>3} {k:>3} {t:>3} {dropped:>4} {r['up']:>12.0f} "
                  f"{r['up'] / plain_up:>7.3f} {r['down']:>13.0f} {r['client_s']:>8.3f} "
                  f"{r['server_s']:>8.3f} {r['plain_s']:>8.4f} {r['err']:>9.2e} {r['bound']:>9.2e}")


def signed_side_by_side(weights: list[np.ndarray], sizes: list[int], bits: int) -> None:
    """Each size's round (no dropout) unsigned and signed, alternating, 3 times each after a
    warm-up round: bytes and the median seconds, and the ratios signed / unsigned."""
    print(f"{'n':>3} {'keys':>8} {'up B/client':>12} {'down B/client':>13} {'client s':>8} "
          f"{'server s':>8}   (median of 3)")
    one_round(3, weights, bits, 0, True)  # warm-up: imports, cached token length
    for n in sizes:
        runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
        for _ in range(3):
            for signed in (False, True):
                runs[signed].append(one_round(n, weights, bits, 0, signed))
        rows = {signed: {**rs[0], **{key: float(np.median([r[key] for r in rs]))
                                     for key in ("client_s", "server_s", "check_client_s",
                                                 "unmask_client_s")
                                     if key in rs[0]}}
                for signed, rs in runs.items()}
        for signed, r in rows.items():
            print(f"{n:>3} {'signed' if signed else 'unsigned':>8} {r['up']:>12.0f} "
                  f"{r['down']:>13.0f} {r['client_s']:>8.3f} {r['server_s']:>8.3f}")
        a, b = rows[False], rows[True]
        print(f"{n:>3} {'ratio':>8} {b['up'] / a['up']:>12.4f} {b['down'] / a['down']:>13.4f} "
              f"{b['client_s'] / a['client_s']:>8.3f} {b['server_s'] / a['server_s']:>8.3f}")
        print(f"{n:>3} {'check':>8} {b['check_up']:>12.0f} {b['check_down']:>13.0f} "
              f"{b['check_client_s']:>8.4f}   (the check stage alone; its signatures make "
              f"unmask's down {b['unmask_down'] - a['unmask_down']:+.0f} B/client and its "
              f"client s {b['unmask_client_s'] - a['unmask_client_s']:+.4f})")


if __name__ == "__main__":
    main()
