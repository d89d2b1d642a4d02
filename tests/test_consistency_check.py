"""SecAgg+'s consistency check with signed keys (Bell et al. 2020; Bonawitz et al. 2017, round
3): every survivor signs the survivor set U3 it is told, and a verifying device releases its
unmask shares only for that U3 and only with t valid signatures of listed survivors over it.

Signatures are checked here with ``cryptography`` directly over the statement as the docs
spell it (tag, run, round, count, sorted ids), not with the code under test; sums against
sums computed from the clients' own inputs.
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Callable

import numpy as np
import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from fedinit.secure_aggregation import RoundFailedError, SecAggClient, SecAggParams
from fedinit.secure_aggregation import wire as sw
from fedinit.secure_aggregation.signing import KeyTrust
from fedinit.secure_aggregation.wire import Stage
from tests.test_secure_aggregation import grid_vectors, over_wire, plain_sum
from tests.test_signed_keys import ROUND, RUN, Driver, Msgs, device_keys, trusts

PARAMS = SecAggParams(threshold=3, num_shares=5, clip=1.0)
ECDSA = ec.ECDSA(hashes.SHA256())


def statement(run: int, rnd: int, u3: list[int]) -> bytes:
    """The docs' statement: tag, run id, round, the count and the sorted ids, big-endian."""
    ids = sorted(u3)
    return (b"fedinit secagg+ survivors v1\x00" + struct.pack(">QQI", run, rnd, len(ids))
            + b"".join(struct.pack(">Q", i) for i in ids))


def verifies(key: ec.EllipticCurvePrivateKey, sig: bytes, text: bytes) -> bool:
    try:
        key.public_key().verify(sig, text, ECDSA)
    except InvalidSignature:
        return False
    return True


def persist(rnd: Driver, trust: dict[int, KeyTrust]) -> None:
    """Each client through its stored state, as a deployment's fresh process would see it."""
    rnd.clients = {i: SecAggClient.from_record(over_wire({0: c.to_record()})[0], trust.get(i))
                   for i, c in rnd.clients.items()}


def to_masked(rnd: Driver) -> Msgs:
    """Setup, share keys and the masked input: the masked-input replies."""
    _, _, shared = rnd.keys()
    return rnd.ask(rnd.server.collect_messages(shared))


# ------------------------------------------------------------------ the honest round
def test_an_honest_signed_round_runs_the_check_and_gives_the_exact_sum() -> None:
    """7 clients on the ring (k = 5, t = 3), each client's state stored and restored between
    stages: every survivor is told the same U3 (all 7), each signs it (the signature
    verifies over the docs' statement under its device key), every unmask request relays
    all 7 signatures, and the sum is exact."""
    ids = list(range(7))
    vectors = grid_vectors(ids, PARAMS, seed=21)
    keys = device_keys(ids)
    trust = trusts(keys)
    rnd = Driver(PARAMS, ids, vectors, trust)
    _, _, shared = rnd.keys()
    persist(rnd, trust)
    masked = rnd.ask(rnd.server.collect_messages(shared))
    persist(rnd, trust)
    assert rnd.server.checks
    check = over_wire(rnd.server.check_messages(masked))
    assert check == {i: {sw.STAGE: Stage.CHECK, sw.SURVIVORS: ids} for i in ids}
    signed = rnd.ask(check)
    persist(rnd, trust)
    for i in ids:
        assert verifies(keys[i], signed[i][sw.SIG], statement(RUN, ROUND, ids))
        assert not verifies(keys[i], signed[i][sw.SIG], statement(RUN, ROUND + 1, ids))
    unmask = rnd.server.unmask_after_check(signed)
    for msg in over_wire(unmask).values():
        assert msg[sw.SIGNERS] == ids and msg[sw.SIGS] == [signed[i][sw.SIG] for i in ids]
    total = rnd.server.aggregate(rnd.ask(unmask))
    for g, p in zip(total, plain_sum(vectors, ids, 1.0), strict=True):
        np.testing.assert_array_equal(g, p)
    assert not rnd.refused


def test_without_signed_keys_the_check_is_skipped() -> None:
    """No device signs: the server has nothing to check with, runs no check stage, and the
    clients release their shares after the masked input as before."""
    ids = list(range(5))
    vectors = grid_vectors(ids, PARAMS, seed=22)
    rnd = Driver(PARAMS, ids, vectors)
    masked = to_masked(rnd)
    assert not rnd.server.checks
    replies = rnd.ask(rnd.server.unmask_messages(masked))
    assert sorted(replies) == ids
    for g, p in zip(rnd.server.aggregate(replies), plain_sum(vectors, ids, 1.0), strict=True):
        np.testing.assert_array_equal(g, p)


def test_a_verifying_device_refuses_to_unmask_without_the_check() -> None:
    """A server that skips the check gets no share from any device with a peer list."""
    ids = list(range(5))
    rnd = Driver(PARAMS, ids, grid_vectors(ids, PARAMS, seed=23), trusts(device_keys(ids)))
    masked = to_masked(rnd)
    assert rnd.ask(rnd.server.unmask_messages(masked)) == {}
    assert rnd.refused == {i: f"secagg client {i}: refused to release its shares: the server "
                              "asked for them without the consistency check; this device "
                              "requires it (secagg-peer-keys)" for i in ids}


# ------------------------------------------------------------------ equivocation
VICTIM = 2
LIED_TO = [0, 1]
"""Told that the victim dropped: asked for its mask-key share (the truth-told give its seed's)."""


@pytest.mark.parametrize("checked", [False, True], ids=["no check", "check"])
def test_a_server_that_tells_neighbours_different_survivor_sets_gets_nothing_from_the_lied_to(
        checked: bool) -> None:
    """5 clients, complete graph, t = 3. Every masked input arrives; the server tells clients
    0 and 1 that the victim dropped (U3 = [0, 1, 3, 4]: asks them for its mask-key shares)
    and the others the truth (U3 = all five: asks them for its seed shares), each request
    consistent with the story told. Without the check (devices that verify nothing) the
    lied-to release the victim's mask-key shares. With it, the server relays every
    signature it got: the lied-to see 2 valid over their story (< t) and refuse, so it holds
    no share of the victim's mask key; the truth-told see 3 and release, and what the
    server can compute is the exact sum of all five."""
    ids = list(range(5))
    vectors = grid_vectors(ids, PARAMS, seed=24)
    keys = device_keys(ids)
    trust = trusts(keys) if checked else {i: KeyTrust(k, None) for i, k in keys.items()}
    rnd = Driver(PARAMS, ids, vectors, trust)
    masked = to_masked(rnd)
    story = [i for i in ids if i != VICTIM]
    if checked:
        check = rnd.server.check_messages(masked)
        for i in LIED_TO:
            check[i][sw.SURVIVORS] = story
        signed = rnd.ask(check)
        assert sorted(signed) == ids  # everyone signs what it is told
        unmask = rnd.server.unmask_after_check(signed)
    else:
        unmask = rnd.server.unmask_messages(masked)
    for i in LIED_TO:
        unmask[i][sw.ACTIVE], unmask[i][sw.DEAD] = story, [VICTIM]
    replies = rnd.ask(unmask)
    mask_key_shares = sum(VICTIM in r[sw.NIDS][len(unmask[i][sw.ACTIVE]):]
                          for i, r in replies.items())
    seed_shares = sum(VICTIM in r[sw.NIDS][:len(unmask[i][sw.ACTIVE])]
                      for i, r in replies.items())
    if not checked:
        assert sorted(replies) == ids and mask_key_shares == 2 and seed_shares == 3
        return
    assert sorted(replies) == [2, 3, 4] and mask_key_shares == 0 and seed_shares == 3
    for i in LIED_TO:
        assert rnd.refused[i] == (
            f"secagg client {i}: refused to release its shares: 2 valid signatures of listed "
            f"survivors over the survivor set it was told (4 clients, run {RUN}, round "
            f"{ROUND}), fewer than the threshold 3 (5 sent; the server may be telling clients "
            "different survivor sets)")
    total = rnd.server.aggregate(replies)
    for g, p in zip(total, plain_sum(vectors, ids, 1.0), strict=True):
        np.testing.assert_array_equal(g, p)


# ------------------------------------------------------------------ bad signatures
EXTRA = 9
"""A client in every device's peer list that is not in this round."""


def _forged(keys: dict[int, ec.EllipticCurvePrivateKey], u3: list[int]) -> tuple[int, bytes]:
    return 3, ec.generate_private_key(ec.SECP384R1()).sign(statement(RUN, ROUND, u3), ECDSA)


def _garbage(keys: dict[int, ec.EllipticCurvePrivateKey], u3: list[int]) -> tuple[int, bytes]:
    return 3, os.urandom(103)


def _unsigned(keys: dict[int, ec.EllipticCurvePrivateKey], u3: list[int]) -> tuple[int, bytes]:
    return 3, b""


def _other_round(keys: dict[int, ec.EllipticCurvePrivateKey], u3: list[int]) -> tuple[int, bytes]:
    return 3, keys[3].sign(statement(RUN, ROUND - 1, u3), ECDSA)


def _other_run(keys: dict[int, ec.EllipticCurvePrivateKey], u3: list[int]) -> tuple[int, bytes]:
    return 3, keys[3].sign(statement(RUN + 1, ROUND, u3), ECDSA)


def _other_set(keys: dict[int, ec.EllipticCurvePrivateKey], u3: list[int]) -> tuple[int, bytes]:
    return 3, keys[3].sign(statement(RUN, ROUND, u3[:-1]), ECDSA)


def _not_survivor(keys: dict[int, ec.EllipticCurvePrivateKey], u3: list[int]) -> tuple[int, bytes]:
    return EXTRA, keys[EXTRA].sign(statement(RUN, ROUND, u3), ECDSA)


def _twice(keys: dict[int, ec.EllipticCurvePrivateKey], u3: list[int]) -> tuple[int, bytes]:
    return 1, keys[1].sign(statement(RUN, ROUND, u3), ECDSA)


def _genuine(keys: dict[int, ec.EllipticCurvePrivateKey], u3: list[int]) -> tuple[int, bytes]:
    return 3, keys[3].sign(statement(RUN, ROUND, u3), ECDSA)


@pytest.mark.parametrize("third", [_forged, _garbage, _unsigned, _other_round, _other_run,
                                   _other_set, _not_survivor, _twice, _genuine],
                         ids=lambda f: f.__name__.strip("_"))
def test_only_valid_signatures_of_listed_survivors_over_this_round_count(
        third: Callable[[dict[int, ec.EllipticCurvePrivateKey], list[int]],
                        tuple[int, bytes]]) -> None:
    """Client 0 is sent two genuine signatures (0's and 1's) and a third: a signature by a
    key not in its list, random bytes, none, 3's over another round, another run or
    another set, a listed client that is not a survivor, 1's again: each counts for nothing,
    so 0 refuses (2 < t); 3's genuine signature makes it release its shares."""
    ids = list(range(5))
    keys = device_keys([*ids, EXTRA])
    trust = trusts(keys)
    rnd = Driver(PARAMS, ids, grid_vectors(ids, PARAMS, seed=25),
                 {i: trust[i] for i in ids})
    signed = rnd.ask(rnd.server.check_messages(to_masked(rnd)))
    unmask = rnd.server.unmask_after_check(signed)
    signer, sig = third(keys, ids)
    unmask[0][sw.SIGNERS] = [0, 1, signer]
    unmask[0][sw.SIGS] = [signed[0][sw.SIG], signed[1][sw.SIG], sig]
    replies = rnd.ask({0: unmask[0]})
    if third is _genuine:
        assert 0 in replies and not rnd.refused
        return
    assert replies == {}
    assert re.fullmatch(r"secagg client 0: refused to release its shares: 2 valid signatures "
                        r"of listed survivors over the survivor set it was told \(5 clients, "
                        rf"run {RUN}, round {ROUND}\), fewer than the threshold 3 \(3 sent; .*",
                        rnd.refused[0]), rnd.refused


# ------------------------------------------------------------------ what a device signs
@pytest.mark.parametrize(("u3", "why"), [
    ([1, 2, 3, 4], "not in the survivor set [1, 2, 3, 4] it is asked to sign"),
    ([0, 1], "a survivor set of 2 clients, fewer than the threshold 3"),
    ([0, 2, 1, 3], "the survivor set [0, 2, 1, 3] is not sorted and distinct"),
])
def test_a_device_signs_no_survivor_set_without_itself_or_below_t(u3: list[int], why: str) -> None:
    ids = list(range(5))
    rnd = Driver(PARAMS, ids, grid_vectors(ids, PARAMS, seed=26), trusts(device_keys(ids)))
    check = rnd.server.check_messages(to_masked(rnd))
    check[0][sw.SURVIVORS] = u3
    assert 0 not in rnd.ask({0: check[0]})
    assert rnd.refused[0] == f"secagg client 0: {why}"


def test_an_unmask_request_that_departs_from_the_signed_set_is_refused() -> None:
    """Honest check (U3 = all five, every signature relayed), then client 0 is asked for the
    mask-key share of client 2, whom the set it signed lists as a survivor."""
    ids = list(range(5))
    rnd = Driver(PARAMS, ids, grid_vectors(ids, PARAMS, seed=27), trusts(device_keys(ids)))
    unmask = rnd.server.unmask_after_check(rnd.ask(rnd.server.check_messages(to_masked(rnd))))
    unmask[0][sw.ACTIVE], unmask[0][sw.DEAD] = [0, 1, 3, 4], [2]
    assert rnd.ask({0: unmask[0]}) == {}
    assert rnd.refused[0] == (
        "secagg client 0: refused to release its shares: asked for seed shares of [0, 1, 3, 4] "
        "and mask-key shares of [2], but the survivor set it signed makes them "
        "[0, 1, 2, 3, 4] and []")


def test_a_malformed_check_reply_drops_only_its_sender_from_the_unmask() -> None:
    """Client 3's signature is 161 bytes: it is asked for no share (and its signature is
    relayed to nobody), yet its masked input stays in the sum, which is exact."""
    ids = list(range(5))
    vectors = grid_vectors(ids, PARAMS, seed=28)
    rnd = Driver(PARAMS, ids, vectors, trusts(device_keys(ids)))
    signed = rnd.ask(rnd.server.check_messages(to_masked(rnd)))
    signed[3][sw.SIG] = bytes(161)
    unmask = rnd.server.unmask_after_check(signed)
    assert sorted(unmask) == [0, 1, 2, 4]
    assert all(m[sw.SIGNERS] == [0, 1, 2, 4] for m in unmask.values())
    assert [(cid, stage) for cid, stage, _ in rnd.server.rejected] == [(3, Stage.CHECK)]
    total = rnd.server.aggregate(rnd.ask(unmask))
    for g, p in zip(total, plain_sum(vectors, ids, 1.0), strict=True):
        np.testing.assert_array_equal(g, p)


# ------------------------------------------------------------------ dropouts after the check
@pytest.mark.parametrize(("in_check", "in_unmask"), [
    ({3}, set()), (set(), {3, 4}), ({3}, {4}), ({3}, {2, 4})],
    ids=["one in the check", "two in unmask", "one in each", "three: too many"])
def test_dropouts_after_the_masked_input_up_to_the_threshold_keep_the_exact_sum(
        in_check: set[int], in_unmask: set[int]) -> None:
    """7 clients on the ring (k = 5, t = 3): a client that drops in the check (never signs)
    or in unmask (signed, then gone) has its masked input in the sum, its seed rebuilt
    from its neighbours'; up to k - t = 2 adjacent dropouts the sum of all seven is exact,
    three adjacent ones leave their seeds with 2 shares each: no sum, never a wrong one."""
    ids = list(range(7))
    vectors = grid_vectors(ids, PARAMS, seed=29)
    rnd = Driver(PARAMS, ids, vectors, trusts(device_keys(ids)))
    check = rnd.server.check_messages(to_masked(rnd))
    signed = rnd.ask({i: m for i, m in check.items() if i not in in_check})
    unmask = rnd.server.unmask_after_check(signed)
    assert all(m[sw.SIGNERS] == sorted(set(ids) - in_check) for m in unmask.values())
    replies = rnd.ask({i: m for i, m in unmask.items() if i not in in_unmask})
    assert not rnd.refused
    if len(in_check | in_unmask) > PARAMS.max_dropouts:
        with pytest.raises(RoundFailedError, match=r"shares of client [234]'s self-mask seed"):
            rnd.server.aggregate(replies)
        return
    total = rnd.server.aggregate(replies)
    for g, p in zip(total, plain_sum(vectors, ids, 1.0), strict=True):
        np.testing.assert_array_equal(g, p)
