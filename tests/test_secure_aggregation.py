"""SecAgg+ core: N simulated clients and the server, in process, through the message dicts.

Every message crosses a Flower ConfigRecord on its way (what a Message would carry). The
sums are checked against sums computed here from the clients' own inputs; the privacy tests
attack with everything the server holds.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pytest
from cryptography.fernet import Fernet
from cryptography.hazmat.primitives.asymmetric import ec
from flwr.app import ConfigRecord
from flwr.common.secure_aggregation.crypto.shamir import combine_shares
from flwr.common.secure_aggregation.crypto.symmetric_encryption import encrypt
from flwr.common.secure_aggregation.secaggplus_utils import (
    pseudo_rand_gen,
    share_keys_plaintext_concat,
)
from flwr.supercore.primitives.asymmetric import bytes_to_private_key, public_key_to_bytes
from scipy.stats import chisquare

from fedinit.secure_aggregation import (
    MODULUS,
    RoundFailedError,
    SecAggClient,
    SecAggInputError,
    SecAggParams,
    SecAggServer,
    Stage,
)
from fedinit.secure_aggregation.envelope import token_length
from fedinit.secure_aggregation.graph import ring_neighbours
from fedinit.secure_aggregation.masks import expand, pairwise_key
from fedinit.secure_aggregation.params import narrowest_field

SHAPES = [(4, 3, 3), (4,), (10, 8)]


def over_wire(msgs: Mapping[int, Mapping[str, Any]]) -> dict[int, dict[str, Any]]:
    """What arrives: each dict serialized as Flower serializes a ConfigRecord, and back."""
    return {nid: dict(ConfigRecord.inflate(ConfigRecord(dict(m)).deflate()))
            for nid, m in msgs.items()}


class Round:
    """One round driven stage by stage; ``log`` keeps every reply the server received."""

    def __init__(self, params: SecAggParams, ids: list[int],
                 vectors: dict[int, list[np.ndarray]]) -> None:
        self.server = SecAggServer(params, ids, SHAPES)
        self.clients = {i: SecAggClient(i) for i in ids}
        self.vectors = vectors
        self.log: dict[str, dict[int, dict[str, Any]]] = {}
        self.tamper: dict[str, Callable[[dict[int, dict[str, Any]]], None]] = {}
        """Per stage: what a hostile client does to the replies before the server reads them."""

    def _ask(self, stage: str, msgs: Mapping[int, Mapping[str, Any]],
             absent: set[int]) -> dict[int, dict[str, Any]]:
        replies = {i: self.clients[i].handle(m, self.vectors.get(i))
                   for i, m in over_wire(msgs).items() if i not in absent}
        self.log[stage] = over_wire(replies)
        if stage in self.tamper:
            self.tamper[stage](self.log[stage])
        return self.log[stage]

    def keys_shared(self) -> dict[int, dict[str, Any]]:
        """Setup and key sharing with every client: the key-sharing replies."""
        replies = self._ask(Stage.SETUP, self.server.setup_messages(), set())
        return self._ask(Stage.SHARE_KEYS, self.server.share_keys_messages(replies), set())

    def run(self, drop_after_keys: set[int] = frozenset(),  # type: ignore[assignment]
            drop_in_unmask: set[int] = frozenset(),  # type: ignore[assignment]
            drop_in_keys: set[int] = frozenset()) -> list[np.ndarray]:  # type: ignore[assignment]
        s = self.server
        replies = self._ask(Stage.SETUP, s.setup_messages(), set())
        replies = self._ask(Stage.SHARE_KEYS, s.share_keys_messages(replies), drop_in_keys)
        self.collect_msgs = over_wire(s.collect_messages(replies))
        replies = self._ask(Stage.COLLECT, self.collect_msgs, drop_after_keys)
        self.unmask_msgs = s.unmask_messages(replies)
        replies = self._ask(Stage.UNMASK, self.unmask_msgs, drop_in_unmask)
        return s.aggregate(replies)


def uniform_vectors(ids: list[int], clip: float, seed: int = 0) -> dict[int, list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    return {i: [rng.uniform(-clip, clip, s) for s in SHAPES] for i in ids}


def grid_vectors(ids: list[int], params: SecAggParams, seed: int = 0
                 ) -> dict[int, list[np.ndarray]]:
    """Values on the quantisation grid: stochastic rounding leaves them exact."""
    rng = np.random.default_rng(seed)
    return {i: [-params.clip + rng.integers(0, params.target_range + 1, s) * params.step
                for s in SHAPES] for i in ids}


def plain_sum(vectors: dict[int, list[np.ndarray]], ids: list[int], clip: float
              ) -> list[np.ndarray]:
    return [sum(np.clip(vectors[i][a], -clip, clip) for i in ids) for a in range(len(SHAPES))]


@pytest.mark.parametrize("bits", [16, 6])
def test_sum_equals_the_plain_sum_within_the_quantisation_bound(bits: int) -> None:
    params = SecAggParams(threshold=3, num_shares=5, clip=0.5, bits=bits)
    ids = [101, 7, 55, 23, 9]
    vectors = uniform_vectors(ids, 0.6)  # some coordinates beyond the clip bound
    got = Round(params, ids, vectors).run()
    bound = len(ids) * 2 * 0.5 / 2**bits  # n clients, each off by < one step 2c/2^bits
    errors = [np.abs(g - p).max() for g, p in zip(got, plain_sum(vectors, ids, 0.5),
                                                  strict=True)]
    assert max(errors) < bound
    assert params.sum_error_bound(len(ids)) == pytest.approx(bound)
    if bits == 6:  # coarse enough that rounding shows: the sum is not the float sum by luck
        assert max(errors) > bound / 20


@pytest.mark.parametrize("bits,clients,field", [
    (8, 5, 16), (8, 255, 16), (8, 256, 32),  # 255 * 256 = 65280 < 2^16; 256 * 256 does not
    (4, 5, 8), (4, 15, 8), (4, 16, 16),      # 15 * 16 = 240 < 2^8; 16 * 16 = 256 does not
    (16, 2, 32), (6, 1, 8), (24, 300, 32),   # the widest when none is narrower
])
def test_the_field_is_the_narrowest_the_sum_cannot_wrap(bits: int, clients: int,
                                                        field: int) -> None:
    assert narrowest_field(bits, clients) == field


@pytest.mark.parametrize("bits,field", [(8, 16), (4, 8)])
def test_a_narrow_field_carries_fewer_bytes_and_sums_exactly(bits: int, field: int) -> None:
    """5 clients of ``bits``-bit values in a 2^``field`` field: each masked coordinate is
    field/8 bytes on the wire, and on-grid inputs (exact after quantisation) sum to the plain
    sum to float precision, also with a client dropped after key sharing (its pairwise
    masks, rebuilt modulo 2^32, cancel modulo 2^field)."""
    ids = [101, 7, 55, 23, 9]
    params = SecAggParams(threshold=3, num_shares=5, clip=0.5, bits=bits,
                          field_bits=narrowest_field(bits, len(ids)))
    assert params.field_bits == field
    vectors = grid_vectors(ids, params)
    for dropped in (set(), {55}):
        rnd = Round(params, ids, vectors)
        got = rnd.run(drop_after_keys=dropped)
        kept = [i for i in ids if i not in dropped]
        errors = [np.abs(g - p).max() for g, p in zip(got, plain_sum(vectors, kept, 0.5),
                                                      strict=True)]
        assert max(errors) < 1e-9
        for reply in rnd.log[Stage.COLLECT].values():
            assert [len(b) for b in reply["masked"]] == [field // 8 * int(np.prod(s))
                                                       for s in SHAPES]


def test_flower_sized_node_ids_travel_and_sum() -> None:
    """Flower node ids are 64-bit unsigned; they cross the wire and the share plaintexts."""
    params = SecAggParams(threshold=2, num_shares=3, clip=1.0)
    ids = [2**64 - 1, 2**63 + 12345, 7]
    vectors = grid_vectors(ids, params, seed=2)
    got = Round(params, ids, vectors).run(drop_after_keys={7})
    for g, p in zip(got, plain_sum(vectors, ids[:2], 1.0), strict=True):
        np.testing.assert_array_equal(g, p)


def test_up_to_k_minus_t_dropouts_after_key_sharing_give_the_exact_sum() -> None:
    params = SecAggParams(threshold=3, num_shares=5, clip=1.0)  # SecAgg+ ring, 9 clients
    ids = list(range(1, 10))
    vectors = grid_vectors(ids, params)
    dropped = {4, 5}  # adjacent: neighbourhoods of 3..6 each lose k - t = 2
    rnd = Round(params, ids, vectors)
    got = rnd.run(drop_after_keys=dropped)
    survivors = [i for i in ids if i not in dropped]
    assert rnd.server.stage_clients[Stage.COLLECT] == survivors
    for g, p in zip(got, plain_sum(vectors, survivors, 1.0), strict=True):
        np.testing.assert_array_equal(g, p)
    assert all(len(n) == 5 for n in rnd.server.neighbours.values())


def test_full_graph_with_a_dropout_in_each_stage_after_setup_is_exact() -> None:
    params = SecAggParams(threshold=4, num_shares=7, clip=1.0)
    ids = [3, 8, 13, 21, 34, 55, 89]  # k >= n: the complete graph (SecAgg), 3 may drop
    vectors = grid_vectors(ids, params, seed=1)
    rnd = Round(params, ids, vectors)
    got = rnd.run(drop_in_keys={3}, drop_after_keys={8}, drop_in_unmask={55})
    survivors = [13, 21, 34, 55, 89]  # 3 sent keys only; 55 uploaded, then missed the unmask stage
    assert rnd.server.stage_clients[Stage.SHARE_KEYS] == [8, 13, 21, 34, 55, 89]
    for g, p in zip(got, plain_sum(vectors, survivors, 1.0), strict=True):
        np.testing.assert_array_equal(g, p)


@pytest.mark.parametrize("drop_after_keys,drop_in_unmask", [({3, 4, 5}, set()),
                                                            ({4, 5}, {6})])
def test_more_dropouts_than_the_threshold_allows_fail_in_one_line(
        drop_after_keys: set[int], drop_in_unmask: set[int]) -> None:
    params = SecAggParams(threshold=3, num_shares=5, clip=1.0)
    ids = list(range(1, 10))
    rnd = Round(params, ids, grid_vectors(ids, params))
    with pytest.raises(RoundFailedError, match=r"threshold is 3 .*no sum$") as err:
        rnd.run(drop_after_keys=drop_after_keys, drop_in_unmask=drop_in_unmask)
    assert "\n" not in str(err.value)


def test_fewer_uploads_than_the_threshold_fail_before_unmasking() -> None:
    params = SecAggParams(threshold=3, num_shares=5, clip=1.0)
    ids = [1, 2, 3, 4]
    rnd = Round(params, ids, grid_vectors(ids, params))
    with pytest.raises(RoundFailedError, match="2 clients replied, fewer than the threshold 3"):
        rnd.run(drop_after_keys={1, 2})


def _held_seeds(rnd: Round) -> dict[int, bytes]:
    """Every self-mask seed the server can rebuild from the unmask replies it holds."""
    shares: dict[int, list[bytes]] = {}
    for reply in rnd.log[Stage.UNMASK].values():
        for owner, share in zip(reply["nids"], reply["shares"], strict=True):
            shares.setdefault(owner, []).append(share)
    seeds = {}
    for owner, got in shares.items():
        secret = combine_shares(got[: rnd.server.params.threshold])
        if hashlib.sha256(secret).digest() == rnd.server.seed_hash.get(owner):
            seeds[owner] = secret
    return seeds


def test_what_the_server_holds_does_not_unmask_one_upload() -> None:
    params = SecAggParams(threshold=3, num_shares=5, clip=1.0)
    ids = list(range(1, 8))
    vectors = uniform_vectors(ids, 1.0, seed=3)
    rnd = Round(params, ids, vectors)
    rnd.run(drop_after_keys={4})
    received = [v for replies in rnd.log.values() for reply in replies.values()
                for value in reply.values()
                for v in (value if isinstance(value, list) else [value]) if isinstance(v, bytes)]
    for nid, client in rnd.clients.items():  # no secret of a client crosses in the clear
        secrets = [client._seed, vectors[nid][2].tobytes()[:64],
                   vectors[nid][2].astype(np.float32).tobytes()[:32]]
        assert not any(x in blob for x in secrets for blob in received)
    assert not any(b"PRIVATE KEY" in blob for blob in received)
    seeds = _held_seeds(rnd)
    assert sorted(seeds) == [1, 2, 3, 5, 6, 7]  # survivors' seeds only, never the dropped one's
    sizes = [int(np.prod(s)) for s in SHAPES]
    for victim in (1, 5):
        masked = [np.frombuffer(b, dtype="<u4").astype(np.int64)
                  for b in rnd.log[Stage.COLLECT][victim]["masked"]]
        residual = np.concatenate([(m - s) % MODULUS for m, s in
                                   zip(masked, expand(seeds[victim], sizes), strict=True)])
        # q(x) lies in 0..2^16; what is left after removing the self mask is uniform mod 2^32
        assert np.mean(residual <= params.target_range) < 0.01
        assert chisquare(np.bincount(residual >> 28, minlength=16)).pvalue > 1e-6
        decoded = -1.0 + (residual % (params.target_range + 1)) * params.step
        truth = np.concatenate([v.ravel() for v in vectors[victim]])
        assert np.abs(decoded - truth).mean() > 0.4  # uniform guesses miss by ~2/3


def test_a_late_upload_of_a_dropped_client_stays_masked() -> None:
    """The server rebuilt sk1 of client 4 (dropped), so it removes 4's pairwise masks; the
    self mask remains, and no survivor released a share of 4's seed."""
    params = SecAggParams(threshold=3, num_shares=5, clip=1.0)
    ids = list(range(1, 8))
    vectors = uniform_vectors(ids, 1.0, seed=4)
    rnd = Round(params, ids, vectors)
    rnd.run(drop_after_keys={4})
    late = rnd.clients[4].masked_input(rnd.collect_msgs[4], vectors[4])
    sk1_shares = [r["shares"][r["nids"].index(4)] for r in rnd.log[Stage.UNMASK].values()
                  if 4 in r["nids"]]
    sk1 = bytes_to_private_key(combine_shares(sk1_shares[:3]))
    total = np.concatenate([np.frombuffer(b, dtype="<u4").astype(np.int64)
                            for b in late["masked"]])
    for peer in rnd.server.neighbours[4]:
        if peer != 4:
            mask = np.concatenate(expand(pairwise_key(sk1, rnd.server.pk1[peer]),
                                         [total.size]))
            total = total - (1 if peer < 4 else -1) * mask
    residual = total % MODULUS
    assert np.mean(residual <= params.target_range) < 0.01
    assert 4 not in _held_seeds(rnd)


def test_a_client_releases_one_kind_of_share_per_peer_and_only_once() -> None:
    params = SecAggParams(threshold=3, num_shares=5, clip=1.0)
    ids = [1, 2, 3, 4, 5]
    rnd = Round(params, ids, grid_vectors(ids, params))
    rnd.run()
    fishing = {"stage": Stage.UNMASK, "active": [1, 2, 3], "dead": [4]}
    with pytest.raises(SecAggInputError, match="'secagg-unmask' out of order"):
        rnd.clients[1].unmask(fishing)  # a second request, now for 4's mask key
    both = {"stage": Stage.UNMASK, "active": [1, 2, 3], "dead": [3]}
    with pytest.raises(SecAggInputError, match="listed twice"):
        _client_at_unmask(params).unmask(both)
    # t - 1 shares of a secret (a split-story server's best when t > k/2) do not rebuild it
    shares = [r["shares"][r["nids"].index(2)] for r in rnd.log[Stage.UNMASK].values()]
    assert hashlib.sha256(combine_shares(shares[:3])).digest() == rnd.server.seed_hash[2]
    assert _rebuilt_or_none(shares[:2]) != combine_shares(shares[:3])


def _rebuilt_or_none(shares: list[bytes]) -> bytes | None:
    try:
        return combine_shares(shares)
    except ValueError:  # the padding of a wrong interpolation does not parse
        return None


def _client_at_unmask(params: SecAggParams) -> SecAggClient:
    ids = [1, 2, 3, 4, 5]
    rnd = Round(params, ids, grid_vectors(ids, params))
    s = rnd.server
    replies = rnd.keys_shared()
    rnd._ask(Stage.COLLECT, s.collect_messages(replies), set())
    return rnd.clients[1]


def test_a_device_refuses_a_threshold_at_or_below_half() -> None:
    client = SecAggClient(1)
    setup = {"stage": Stage.SETUP, "sizes": [3], "threshold": 2, "num-shares": 5,
             "clip": 1.0, "bits": 16, "field-bits": 32}
    with pytest.raises(SecAggInputError, match=r"threshold must be in 3\.\.5 .*got 2$"):
        client.setup(setup)


def test_flowers_prg_has_a_32_bit_seed_and_ours_does_not() -> None:
    """Why masks.py expands with ChaCha20: Flower's folds 32 bytes to 32 bits."""
    a = bytes(range(32))
    b = a[4:8] + a[:4] + a[8:]  # two words swapped: the same XOR of 4-byte words
    flower = [pseudo_rand_gen(s, MODULUS, [(64,)])[0] for s in (a, b)]
    np.testing.assert_array_equal(*flower)
    ours = [expand(s, [64])[0] for s in (a, b)]
    assert not np.array_equal(*ours)
    assert ours[0].min() >= 0 and ours[0].max() < MODULUS


def _one_line(err: pytest.ExceptionInfo[BaseException]) -> str:
    assert "\n" not in str(err.value)
    return str(err.value)


def test_a_malformed_share_drops_that_reply_and_the_sum_stays_exact() -> None:
    """Client 2's unmask reply carries a bad share: a wrong length or index drops its reply
    (its upload stays in the sum, the others' shares rebuild the secrets); a flipped bit
    passes the layout check and is outvoted by another t-subset (the seed hash decides)."""
    params = SecAggParams(threshold=3, num_shares=5, clip=1.0)
    ids = [1, 2, 3, 4, 5]
    vectors = grid_vectors(ids, params)
    for corrupt, pattern in [(lambda s: s[:-3], "expected 4 \\+ a multiple of 16"),
                             (lambda s: s[:10] + bytes([s[10] ^ 1]) + s[11:], None),
                             (lambda s: (99).to_bytes(4, "little") + s[4:], "has index 99")]:
        rnd = Round(params, ids, vectors)

        def bad_share(replies: dict[int, dict[str, Any]], corrupt: Any = corrupt) -> None:
            replies[2]["shares"][0] = corrupt(replies[2]["shares"][0])

        rnd.tamper[Stage.UNMASK] = bad_share
        got = rnd.run()
        for g, p in zip(got, plain_sum(vectors, ids, 1.0), strict=True):
            np.testing.assert_array_equal(g, p)
        if pattern is None:
            assert rnd.server.rejected == []
        else:
            [(nid, stage, why)] = rnd.server.rejected
            assert (nid, stage) == (2, Stage.UNMASK) and re.search(pattern, why), why


def test_shares_that_rebuild_no_valid_secret_fail_in_one_line() -> None:
    """Every holder's share of client 1's seed flipped: no t-subset matches its hash."""
    params = SecAggParams(threshold=3, num_shares=5, clip=1.0)
    ids = [1, 2, 3, 4, 5]
    rnd = Round(params, ids, grid_vectors(ids, params))

    def flip(replies: dict[int, dict[str, Any]]) -> None:
        for reply in replies.values():
            i = reply["nids"].index(1)
            share = reply["shares"][i]
            reply["shares"][i] = share[:10] + bytes([share[10] ^ 1]) + share[11:]

    rnd.tamper[Stage.UNMASK] = flip
    with pytest.raises(SecAggInputError, match=r"^secagg: no 3 of the 5 shares of client 1's "
                                               r"self-mask seed rebuild it") as err:
        rnd.run()
    _one_line(err)


def _pem_of(rnd: Round, nid: int) -> bytes:
    return rnd.clients[nid]._pk1  # noqa: SLF001 - the key a copier would send


HOSTILE: dict[str, tuple[str, Callable[[dict[int, dict[str, Any]]], None], set[int], str]] = {
    "setup: pk1 missing": (Stage.SETUP, lambda r: r[3].pop("pk1"), {3},
                           "'pk1' must be non-empty bytes, got NoneType"),
    "setup: pk2 an int": (Stage.SETUP, lambda r: r[3].update(pk2=7), {3},
                          "'pk2' must be non-empty bytes, got int"),
    "setup: pk1 not PEM": (Stage.SETUP, lambda r: r[3].update(pk1=b"x" * 91), {3},
                           "'pk1' is not a PEM public key"),
    "setup: wrong stage": (Stage.SETUP, lambda r: r[3].update(stage="secagg-unmask"), {3},
                           "stage 'secagg-unmask' where 'secagg-setup' was expected"),
    "setup: pk1 copied from 2": (Stage.SETUP, lambda r: r[3].update(pk1=r[2]["pk1"]), {2, 3},
                                 "a public key it sent is also sent by"),
    "setup: pk1 on another curve": (
        Stage.SETUP, lambda r: r[3].update(pk1=_p256_pem()), {3},
        "'pk1' is not a public key on secp384r1"),
    "share keys: a ciphertext 16 bytes short": (
        Stage.SHARE_KEYS, lambda r: r[3]["ctxts"].__setitem__(1, r[3]["ctxts"][1][:-16]), {3},
        f"the ciphertext for 2 has {token_length() - 16} bytes, expected {token_length()}"),
    "share keys: a ciphertext of 3 garbage bytes": (
        Stage.SHARE_KEYS, lambda r: r[3]["ctxts"].__setitem__(0, b"xyz"), {3},
        "the ciphertext for 1 has 3 bytes, expected"),
    "setup: pk2 = own pk1": (Stage.SETUP, lambda r: r[3].update(pk2=r[3]["pk1"]), {3},
                             "a public key it sent is also its other key"),
    "share keys: one ciphertext short": (
        Stage.SHARE_KEYS, lambda r: r[3].update(ctxts=r[3]["ctxts"][:-1]), {3},
        "'ctxts' has 3 entries, expected 4"),
    "share keys: a share for an unknown node": (
        Stage.SHARE_KEYS, lambda r: r[3].update(dsts=[*r[3]["dsts"][:-1], 99]), {3},
        "destinations .*99.*, its neighbours are"),
    "share keys: a destination twice": (
        Stage.SHARE_KEYS, lambda r: r[3].update(dsts=[r[3]["dsts"][0]] * 4), {3},
        "destinations .*, its neighbours are"),
    "share keys: a short seed hash": (
        Stage.SHARE_KEYS, lambda r: r[3].update({"seed-hash": b"\x01" * 31}), {3},
        "seed hash of 31 bytes, expected 32"),
    "share keys: dsts not ints": (
        Stage.SHARE_KEYS, lambda r: r[3].update(dsts=["1", "2", "4", "5"]), {3},
        "'dsts' must be a list of non-negative ints"),
    "masked: one array short": (
        Stage.COLLECT, lambda r: r[3].update(masked=r[3]["masked"][:2]), {3},
        "'masked' has 2 entries, expected 3"),
    "masked: 4 bytes short": (
        Stage.COLLECT, lambda r: r[3]["masked"].__setitem__(1, r[3]["masked"][1][:-4]), {3},
        "masked array 1 has 12 bytes, expected 16 "),
    "masked: ints, not bytes": (
        Stage.COLLECT, lambda r: r[3].update(masked=[1, 2, 3]), {3},
        "'masked' must be a list of bytes, got list"),
    "masked: float64 bytes": (
        Stage.COLLECT, lambda r: r[3]["masked"].__setitem__(
            0, np.zeros(36, dtype=np.float64).tobytes()), {3},
        "masked array 0 has 288 bytes, expected 144"),
}


def _p256_pem() -> bytes:
    return public_key_to_bytes(ec.generate_private_key(ec.SECP256R1()).public_key())


def _garbage_token(_: Round, __: int = 0) -> bytes:
    """Bytes of a ciphertext's length that are no Fernet token."""
    return bytes(range(256))[:token_length()] + b"\x00" * max(0, token_length() - 256)


def _foreign_token(_: Round, __: int) -> bytes:
    """A well-formed token of the right length, sealed under a key nobody in the round has."""
    fernet = Fernet(Fernet.generate_key())
    return next(t for n in range(512) if len(t := fernet.encrypt(b"\x00" * n)) == token_length())


def _mislabelled_token(rnd: Round, dst: int) -> bytes:
    """Client 3's own key to ``dst``, over a plaintext labelled 3 -> 6 (another pair's)."""
    own = rnd.clients[3]._held[3]  # noqa: SLF001 - a hostile client's own shares
    return encrypt(rnd.clients[3]._enc_keys[dst],  # noqa: SLF001
                   share_keys_plaintext_concat(3, 6, own[0], own[1]))


def _short_share_token(rnd: Round, dst: int) -> bytes:
    """Client 3's own key to ``dst`` and the right labels, its seed share 16 bytes short and
    its other share 16 long: the same token length, so the server cannot see it."""
    own = rnd.clients[3]._held[3]  # noqa: SLF001
    return encrypt(rnd.clients[3]._enc_keys[dst],  # noqa: SLF001
                   share_keys_plaintext_concat(3, dst, own[0][:-16], own[1] + b"\x00" * 16))


SEALED: dict[str, tuple[Callable[[Round, int], bytes], str]] = {
    "garbage bytes of the right length": (_garbage_token, "do not decrypt"),
    "a token under a foreign key": (_foreign_token, "do not decrypt"),
    "another pair's labels": (_mislabelled_token, "labelled 3->6, sent as 3->"),
    "a share of the wrong length": (_short_share_token, "shares of 36 and"),
}


@pytest.mark.parametrize("to_all", [False, True], ids=["to 1", "to all 4"])
@pytest.mark.parametrize("name", sorted(SEALED))
def test_a_ciphertext_only_its_recipient_can_check_drops_its_sender(
        name: str, to_all: bool, caplog: pytest.LogCaptureFixture) -> None:
    """Client 3 (ring of 6, t=3, k=5: neighbours 1, 2, 4, 5) sends a ciphertext the server
    cannot tell from a good one, to client 1 or to all four. Each recipient leaves 3 out (one
    line of its own) and reports it; the server drops 3 once, naming who reported it; the sum
    is exactly that of the other five, the reporters' masks with 3 cancelled with the keys
    they reveal (to all four: no neighbour holds a share of 3's mask key)."""
    make, why = SEALED[name]
    params = SecAggParams(threshold=3, num_shares=5, clip=1.0)
    ids = [1, 2, 3, 4, 5, 6]
    vectors = grid_vectors(ids, params, seed=7)
    rnd = Round(params, ids, vectors)

    def seal(replies: dict[int, dict[str, Any]]) -> None:
        for pos, dst in enumerate(replies[3]["dsts"]):
            if to_all or dst == 1:
                replies[3]["ctxts"][pos] = make(rnd, dst)

    rnd.tamper[Stage.SHARE_KEYS] = seal
    with caplog.at_level(logging.WARNING, logger="flwr"):
        got = rnd.run()
    for g, p in zip(got, plain_sum(vectors, [1, 2, 4, 5, 6], 1.0), strict=True):
        np.testing.assert_array_equal(g, p)
    reporters = [1, 2, 4, 5] if to_all else [1]
    assert [n for n in ids if rnd.log[Stage.COLLECT][n]["bad-srcs"]] == reporters
    assert all(rnd.log[Stage.COLLECT][n]["bad-srcs"] == [3] for n in reporters)
    assert rnd.server.rejected == [(3, Stage.SHARE_KEYS, (
        f"secagg: the encrypted shares client 3 sent to {reporters} do not open there "
        f"(reported by them in the masked-input stage)"))]
    assert rnd.server.stage_clients[Stage.COLLECT] == [1, 2, 4, 5, 6]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == len(reporters) and all(
        re.fullmatch(rf"secagg client {n}: left out client 3, whose encrypted shares cannot "
                     rf"be used \(.*{why}.*\); reported to the server", line)
        for n, line in zip(reporters, lines, strict=True)), lines
    revealed = {n for n, m in rnd.unmask_msgs.items() if "reveal" in m}
    assert revealed == {1, 2, 4, 5} and all(rnd.unmask_msgs[n]["reveal"] == [3]
                                            for n in revealed)
    for n in reporters:  # a reporter is never asked for a share it does not hold
        assert 3 not in rnd.unmask_msgs[n]["dead"]


def test_a_reported_client_with_too_few_shares_and_a_silent_peer_fails_in_one_line() -> None:
    """All four neighbours of 3 report it, and 4 then drops in unmask: nothing holds a share
    of 3's mask key and 4's mask with 3 cannot be cancelled, so the round has no sum."""
    params = SecAggParams(threshold=3, num_shares=5, clip=1.0)
    ids = [1, 2, 3, 4, 5, 6]
    rnd = Round(params, ids, grid_vectors(ids, params))
    rnd.tamper[Stage.SHARE_KEYS] = lambda r: r[3].update(
        ctxts=[_garbage_token(rnd)] * len(r[3]["ctxts"]))
    with pytest.raises(RoundFailedError, match=r"^secagg unmask: 0 shares of reported client 3's "
                       r"mask key \(threshold 3\) and no mask key of its pair with \[4\]; no sum$"):
        rnd.run(drop_in_unmask={4})


def test_unasked_pairwise_keys_in_an_unmask_reply_are_ignored() -> None:
    """A client that adds keys nobody asked for (lists of unequal length at that) changes
    nothing: the server reads only what it asked each client to reveal."""
    params = SecAggParams(threshold=3, num_shares=5, clip=1.0)
    ids = [1, 2, 3, 4, 5, 6]
    vectors = grid_vectors(ids, params, seed=3)
    rnd = Round(params, ids, vectors)
    rnd.tamper[Stage.UNMASK] = lambda r: r[3].update({"reveal": [1, 2], "pair-keys": [b"k"]})
    got = rnd.run()
    for g, p in zip(got, plain_sum(vectors, ids, 1.0), strict=True):
        np.testing.assert_array_equal(g, p)
    assert rnd.server.rejected == []


def test_a_client_reveals_no_mask_key_of_a_survivor() -> None:
    """A server asking a client for its pairwise key with a survivor (whose seed share it
    also asks for) is refused: the two would unmask that survivor's pair."""
    params = SecAggParams(threshold=3, num_shares=5, clip=1.0)
    ids = [1, 2, 3, 4, 5]
    rnd = Round(params, ids, grid_vectors(ids, params))
    s = rnd.server
    replies = rnd.keys_shared()
    replies = rnd._ask(Stage.COLLECT, over_wire(s.collect_messages(replies)), set())
    ask = dict(s.unmask_messages(replies)[1])
    ask["reveal"] = [2]
    with pytest.raises(SecAggInputError, match=r"asked to reveal its mask keys with \[2\]"):
        rnd.clients[1].unmask(ask)


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_reply_drops_its_client_and_the_round_sums_the_rest(name: str) -> None:
    """Each malformed reply in a 6-client SecAgg+ ring (t=3, k=5): that client (and a client
    whose key was copied) is dropped with its reason kept, the rest sum exactly."""
    stage, tamper, dropped, pattern = HOSTILE[name]
    params = SecAggParams(threshold=3, num_shares=5, clip=1.0)
    ids = [1, 2, 3, 4, 5, 6]
    vectors = grid_vectors(ids, params, seed=4)
    rnd = Round(params, ids, vectors)
    rnd.tamper[stage] = tamper
    got = rnd.run()
    for g, p in zip(got, plain_sum(vectors, [i for i in ids if i not in dropped], 1.0),
                    strict=True):
        np.testing.assert_array_equal(g, p)
    assert {nid for nid, _, _ in rnd.server.rejected} == dropped
    assert all(s == stage and "\n" not in why for _, s, why in rnd.server.rejected)
    assert any(re.search(pattern, why) for _, _, why in rnd.server.rejected), \
        rnd.server.rejected


def test_hostile_replies_below_the_threshold_fail_the_round_in_one_line() -> None:
    params = SecAggParams(threshold=3, num_shares=5, clip=1.0)
    ids = [1, 2, 3, 4]

    def two_bad(replies: dict[int, dict[str, Any]]) -> None:
        replies[1].pop("pk1")
        replies[2]["pk2"] = b"not a key"

    rnd = Round(params, ids, grid_vectors(ids, params))
    rnd.tamper[Stage.SETUP] = two_bad
    with pytest.raises(RoundFailedError, match=r"^secagg-setup: 2 clients replied, fewer than "
                                               r"the threshold 3; no sum$"):
        rnd.run()
    assert [nid for nid, _, _ in rnd.server.rejected] == [1, 2]


def test_a_client_refuses_bad_input_in_one_line() -> None:
    params = SecAggParams(threshold=3, num_shares=5, clip=1.0)
    ids = [1, 2, 3, 4, 5]
    rnd = Round(params, ids, grid_vectors(ids, params))
    s = rnd.server
    replies = rnd.keys_shared()
    msgs = over_wire(s.collect_messages(replies))
    good = rnd.vectors[1]
    nan = [good[0], good[1].copy(), good[2]]
    nan[1][0] = np.nan
    with pytest.raises(SecAggInputError, match="array 1 has a non-finite value") as err:
        rnd.clients[1].masked_input(msgs[1], nan)
    _one_line(err)
    with pytest.raises(SecAggInputError, match="array 2 has 79 values, the round expects 80"):
        rnd.clients[1].masked_input(msgs[1], [good[0], good[1], good[2].ravel()[:-1]])
    tampered = dict(msgs[2])
    tampered["ctxts"] = [c[:-2] + b"AA" for c in msgs[2]["ctxts"]]
    reply = rnd.clients[2].masked_input(tampered, rnd.vectors[2])  # reports, does not fail
    assert reply["bad-srcs"] == msgs[2]["srcs"] and len(reply["masked"]) == len(SHAPES)
    with pytest.raises(SecAggInputError, match="unknown stage 'fit'"):
        rnd.clients[3].handle({"stage": "fit"})


@pytest.mark.parametrize("kwargs,pattern", [
    ({"threshold": 3, "num_shares": 4, "clip": 1.0}, "num-shares must be odd"),
    ({"threshold": 3, "num_shares": 5, "clip": 0.0}, "clip must be a finite number > 0"),
    ({"threshold": 3, "num_shares": 5, "clip": 1.0, "bits": 30}, r"bits must be in 1\.\.24"),
    ({"threshold": 6, "num_shares": 5, "clip": 1.0}, r"threshold must be in 3\.\.5"),
    ({"threshold": 3, "num_shares": 5, "clip": 1.0, "field_bits": 12},
     r"field-bits must be one of 8, 16, 32 and above bits=16, got 12"),
    ({"threshold": 3, "num_shares": 5, "clip": 1.0, "bits": 8, "field_bits": 8},
     r"field-bits must be one of 8, 16, 32 and above bits=8, got 8"),
])
def test_bad_parameters_get_one_line(kwargs: dict[str, Any], pattern: str) -> None:
    with pytest.raises(SecAggInputError, match=pattern) as err:
        SecAggParams(**kwargs)
    _one_line(err)


def test_the_ring_is_symmetric_with_k_members() -> None:
    nbrs = ring_neighbours([40, 10, 30, 20, 50, 60, 70], 5)
    assert all(len(v) == 5 and k in v for k, v in nbrs.items())
    assert all(k in nbrs[j] for k, v in nbrs.items() for j in v)
    assert ring_neighbours([1, 2, 3], 5) == {i: [1, 2, 3] for i in (1, 2, 3)}


class StoredRound(Round):
    """Each client rebuilt from its stored record (as Flower serialises it) before every
    stage: what a node that runs each message in a fresh process does."""

    def _ask(self, stage: str, msgs: Mapping[int, Mapping[str, Any]],
             absent: set[int]) -> dict[int, dict[str, Any]]:
        for i, client in self.clients.items():
            stored = dict(ConfigRecord.inflate(ConfigRecord(client.to_record()).deflate()))
            self.clients[i] = SecAggClient.from_record(stored)
        return super()._ask(stage, msgs, absent)


def test_a_client_restored_from_its_record_before_each_stage_gives_the_same_exact_sum() -> None:
    params = SecAggParams(threshold=3, num_shares=5, clip=1.0)
    ids = list(range(7))
    vectors = grid_vectors(ids, params, seed=4)
    rnd = StoredRound(params, ids, vectors)
    got = rnd.run(drop_after_keys={3})
    for g, p in zip(got, plain_sum(vectors, [i for i in ids if i != 3], 1.0), strict=True):
        np.testing.assert_array_equal(g, p)
    done = SecAggClient.from_record(rnd.clients[0].to_record())
    assert set(rnd.clients[0].to_record()) == {"node-id", "next"}  # secrets dropped when done
    with pytest.raises(SecAggInputError, match="out of order"):
        done.handle({"stage": Stage.UNMASK, "active": [0], "dead": []})  # no second unmask


@pytest.mark.parametrize(("record", "pattern"), [
    ({"node-id": 1, "next": "later"}, "^secagg client state: stage 'later' is not a stage$"),
    ({"node-id": 1, "next": Stage.SHARE_KEYS}, "^secagg setup lacks threshold, num-shares"),
    ({"next": Stage.SETUP}, "^secagg client state does not parse: 'node-id'$"),
])
def test_a_bad_stored_state_is_refused_in_one_line(record: dict[str, Any], pattern: str) -> None:
    with pytest.raises(SecAggInputError, match=pattern):
        SecAggClient.from_record(record)
