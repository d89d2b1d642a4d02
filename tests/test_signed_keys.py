"""Signed SecAgg+ keys: a server that relays the public keys cannot swap them (issue 35).

Each client signs (run, round, client id, pk1, pk2) with its device's key; a device with the
operator's peer list uses only neighbours whose signature verifies. The man-in-the-middle
test runs the same hostile server twice: without signatures it recovers the victim's upload
from what it holds (the attack is real), with them it holds nothing to recover it from.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cryptography.fernet import InvalidToken
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.common.secure_aggregation.crypto.shamir import combine_shares
from flwr.common.secure_aggregation.crypto.symmetric_encryption import (
    decrypt,
    generate_shared_key,
)
from flwr.common.secure_aggregation.secaggplus_utils import share_keys_plaintext_separate
from flwr.supercore.primitives.asymmetric import (
    bytes_to_private_key,
    bytes_to_public_key,
    generate_key_pairs,
    public_key_to_bytes,
)

from client_app.app import query_fn
from client_app.secagg_trust import TrustError, fresh_round, parse_peer_keys, trust_of
from fedinit.cli.inprocess_grid import InProcessGrid, set_task_identity
from fedinit.config import RunConfig
from fedinit.methods import wire as rk
from fedinit.secure_aggregation import (
    MODULUS,
    SecAggClient,
    SecAggInputError,
    SecAggParams,
    SecAggServer,
)
from fedinit.secure_aggregation import wire as sw
from fedinit.secure_aggregation.masks import expand, pairwise_key
from fedinit.secure_aggregation.quant import dequantise_sum
from fedinit.secure_aggregation.signing import KeyTrust, statement
from fedinit.secure_aggregation.wire import Stage
from server_app.checkpoint import load_checkpoint
from server_app.experiment import run_experiment
from tests.test_secure_aggregation import SHAPES, grid_vectors, over_wire, plain_sum

pytestmark = pytest.mark.usefixtures("quick_runs")  # no test here reads a plot

RUN, ROUND = 7, 4
Msgs = dict[int, dict[str, Any]]


def device_keys(ids: list[int]) -> dict[int, ec.EllipticCurvePrivateKey]:
    return {i: ec.generate_private_key(ec.SECP384R1()) for i in ids}


def trusts(keys: dict[int, ec.EllipticCurvePrivateKey]) -> dict[int, KeyTrust]:
    peers = {i: k.public_key() for i, k in keys.items()}
    return {i: KeyTrust(k, peers) for i, k in keys.items()}


class Driver:
    """One round stage by stage; a client that refuses a stage (SecAggInputError) is absent
    from its replies; ``hostile`` rewrites the server's share-keys messages."""

    def __init__(self, params: SecAggParams, ids: list[int], vectors: dict[int, list[np.ndarray]],
                 trust: dict[int, KeyTrust] | None = None, server_round: int = ROUND) -> None:
        self.server = SecAggServer(params, ids, SHAPES)
        self.clients = {i: SecAggClient(i, (trust or {}).get(i), RUN, server_round)
                        for i in ids}
        self.vectors = vectors
        self.refused: dict[int, str] = {}
        self.hostile: Callable[[Msgs, Msgs], None] | None = None

    def ask(self, msgs: Msgs) -> Msgs:
        out = {}
        for i, m in over_wire(msgs).items():
            try:
                out[i] = self.clients[i].handle(m, self.vectors.get(i))
            except SecAggInputError as err:
                self.refused[i] = str(err)
        return over_wire(out)

    def keys(self) -> tuple[Msgs, Msgs, Msgs]:
        """(setup replies, share-keys messages as sent, share-keys replies)."""
        setup = self.ask(self.server.setup_messages())
        share_msgs = over_wire(self.server.share_keys_messages(setup))
        if self.hostile is not None:
            self.hostile(setup, share_msgs)
        return setup, share_msgs, self.ask(share_msgs)

    def finish(self, shared: Msgs) -> list[np.ndarray]:
        """The rest of the round: masked input, the consistency check (signed keys), unmask."""
        masked = self.ask(self.server.collect_messages(shared))
        if not self.server.checks:
            return self.server.aggregate(self.ask(self.server.unmask_messages(masked)))
        signed = self.ask(self.server.check_messages(masked))
        return self.server.aggregate(self.ask(self.server.unmask_after_check(signed)))


def test_a_signed_round_gives_the_exact_sum_and_relays_every_signature() -> None:
    params = SecAggParams(threshold=3, num_shares=5, clip=1.0)
    ids = list(range(7))
    vectors = grid_vectors(ids, params, seed=3)
    keys = device_keys(ids)
    rnd = Driver(params, ids, vectors, trusts(keys))
    setup, share_msgs, shared = rnd.keys()
    for i in ids:  # each signature verifies under that device's key, for this run and round
        pub = keys[i].public_key()
        assert KeyTrust(None, {i: pub}).problem(RUN, ROUND, i, setup[i][sw.PK1],
                                                setup[i][sw.PK2], setup[i][sw.SIG]) is None
    for msg in share_msgs.values():  # relayed untouched, in the neighbours' order
        assert msg[sw.SIGS] == [setup[j][sw.SIG] for j in msg[sw.NIDS]]
    assert not any(sw.UNVERIFIED in r for r in shared.values())
    got = rnd.finish(shared)
    for g, p in zip(got, plain_sum(vectors, ids, 1.0), strict=True):
        np.testing.assert_array_equal(g, p)
    assert not rnd.refused


# ------------------------------------------------------------------ the man in the middle
VICTIM = 2


class ManInTheMiddle:
    """A server that hands the victim its own keys in place of ``swapped`` neighbours' (and
    those neighbours its own keys in place of the victim's), keeping the signatures it got."""

    def __init__(self, swapped: list[int]) -> None:
        self.swapped = swapped
        self.forged = {j: (generate_key_pairs()[0], generate_key_pairs()[0])
                       for j in [*swapped, VICTIM]}

    def pub(self, j: int, which: int) -> bytes:
        return public_key_to_bytes(self.forged[j][which].public_key())

    def __call__(self, setup: Msgs, msgs: Msgs) -> None:
        for dst, msg in msgs.items():
            fake = self.swapped if dst == VICTIM else [VICTIM] if dst in self.swapped else []
            for j in fake:
                pos = msg[sw.NIDS].index(j)
                msg[sw.PK1S][pos], msg[sw.PK2S][pos] = self.pub(j, 0), self.pub(j, 1)

    def recover(self, params: SecAggParams, setup: Msgs, shared: Msgs,
                masked: Msgs) -> list[np.ndarray] | None:
        """The victim's input from everything this server holds, or None: open the shares
        the victim sealed for forged keys, rebuild its seed and mask key from t of them,
        strip every mask from its masked input."""
        own = setup[VICTIM]
        opened = []
        for dst, ctxt in zip(shared.get(VICTIM, {}).get(sw.DSTS, []),
                             shared.get(VICTIM, {}).get(sw.CTXTS, []), strict=True):
            if dst in self.swapped:
                key = generate_shared_key(self.forged[dst][1], bytes_to_public_key(own[sw.PK2]))
                try:
                    opened.append(share_keys_plaintext_separate(decrypt(key, ctxt))[2:])
                except InvalidToken:
                    continue
        if len(opened) < params.threshold or VICTIM not in masked:
            return None
        seed = combine_shares([s for s, _ in opened])
        sk1 = bytes_to_private_key(combine_shares([k for _, k in opened]))
        total = [np.frombuffer(b, dtype="<u4").astype(np.int64)
                 for b in masked[VICTIM][sw.MASKED]]
        for arr, m in zip(total, expand(seed, [a.size for a in total]), strict=True):
            arr -= m
        for j in self.swapped:  # the victim masked with the forged pk1 it was given
            sign = 1 if j < VICTIM else -1
            for arr, m in zip(total, expand(pairwise_key(sk1, self.pub(j, 0)),
                                            [a.size for a in total]), strict=True):
                arr -= sign * m
        return dequantise_sum([a % MODULUS for a in total], 1, params, SHAPES)


@pytest.mark.parametrize("signed", [False, True], ids=["unsigned", "signed"])
def test_a_server_that_swaps_the_victims_neighbours_keys_recovers_its_upload_only_unsigned(
        signed: bool, caplog: pytest.LogCaptureFixture) -> None:
    """5 clients, complete graph, t = 3; the server stands between the victim and all four
    neighbours. Unsigned: it opens the victim's shares, rebuilds its seed and mask key and
    reads its upload within one quantisation step. Signed: every neighbour drops the forged
    entry (no share, no mask under it, reported), the victim refuses its forged
    neighbourhood, the server holds no share and no upload of the victim, and the other
    four still sum exactly."""
    params = SecAggParams(threshold=3, num_shares=5, clip=1.0)
    ids = list(range(5))
    vectors = grid_vectors(ids, params, seed=8)
    rnd = Driver(params, ids, vectors, trusts(device_keys(ids)) if signed else None)
    mitm = ManInTheMiddle([j for j in ids if j != VICTIM])
    rnd.hostile = mitm
    with caplog.at_level(logging.WARNING, logger="flwr"):
        setup, _, shared = rnd.keys()
    refused = dict(rnd.refused)
    # what a hostile server then sends the victim to get its masked input: the victim
    # cannot tell ciphertexts of the right length from its neighbours', so garbage will do
    collect = {VICTIM: {sw.STAGE: Stage.COLLECT, sw.SRCS: mitm.swapped,
                        sw.CTXTS: [bytes(256)] * len(mitm.swapped)}}
    masked = rnd.ask(collect)
    got = mitm.recover(params, setup, shared, masked)
    truth = vectors[VICTIM]
    if not signed:
        assert got is not None
        assert max(float(np.max(np.abs(g - t))) for g, t in zip(got, truth, strict=True)) \
            <= params.step
        return
    assert got is None
    assert VICTIM not in shared and VICTIM not in masked
    assert refused[VICTIM] == (f"secagg client {VICTIM}: 1 clients of its neighbourhood "
                                   "have keys it can verify, fewer than the threshold 3")
    for j in mitm.swapped:  # each neighbour left the forged entry out and said so
        assert shared[j][sw.UNVERIFIED] == [VICTIM]
        assert VICTIM not in shared[j][sw.DSTS]
    lines = [r.getMessage() for r in caplog.records]
    assert sum(f"left out client {VICTIM}, whose keys it cannot verify" in line
               for line in lines) == 4
    total = rnd.finish(shared)  # the honest rest: exact
    rest = [i for i in ids if i != VICTIM]
    for g, p in zip(total, plain_sum(vectors, rest, 1.0), strict=True):
        np.testing.assert_array_equal(g, p)
    assert rnd.server.stage_clients[Stage.SHARE_KEYS] == rest  # it never joined the sum


def test_one_swapped_neighbour_is_dropped_and_gets_no_share() -> None:
    """The server swaps only neighbour 4's keys towards the victim (and the victim's towards
    4): the two drop each other, no ciphertext is ever sealed under a forged key, the server
    drops both as reported, and the other three sum exactly."""
    params = SecAggParams(threshold=3, num_shares=5, clip=1.0)
    ids = list(range(5))
    vectors = grid_vectors(ids, params, seed=9)
    rnd = Driver(params, ids, vectors, trusts(device_keys(ids)))
    mitm = ManInTheMiddle([4])
    rnd.hostile = mitm
    setup, _, shared = rnd.keys()
    assert shared[VICTIM][sw.UNVERIFIED] == [4] and 4 not in shared[VICTIM][sw.DSTS]
    assert shared[4][sw.UNVERIFIED] == [VICTIM] and VICTIM not in shared[4][sw.DSTS]
    assert mitm.recover(params, setup, shared, {}) is None
    total = rnd.finish(shared)
    for g, p in zip(total, plain_sum(vectors, [0, 1, 3], 1.0), strict=True):
        np.testing.assert_array_equal(g, p)
    assert sorted({cid for cid, _, _ in rnd.server.rejected}) == [VICTIM, 4]


# ------------------------------------------------------------------ replay
@pytest.mark.parametrize(("run", "rnd"), [(RUN, ROUND - 1), (RUN + 1, ROUND)],
                         ids=["another round", "another run"])
def test_a_signature_from_another_round_or_run_is_rejected(run: int, rnd: int) -> None:
    """The server replays client 3's keys and signature from another round (or run) to its
    neighbours: each drops client 3 and reports it; the others sum exactly."""
    params = SecAggParams(threshold=3, num_shares=5, clip=1.0)
    ids = list(range(5))
    keys = device_keys(ids)
    trust = trusts(keys)
    old = SecAggClient(3, trust[3], run, rnd).handle(
        {sw.STAGE: Stage.SETUP, sw.SIZES: [int(np.prod(s)) for s in SHAPES],
         **params.to_config()})
    vectors = grid_vectors(ids, params, seed=10)
    driver = Driver(params, ids, vectors, trust)

    def replay(setup: Msgs, msgs: Msgs) -> None:
        for msg in msgs.values():
            pos = msg[sw.NIDS].index(3)
            msg[sw.PK1S][pos], msg[sw.PK2S][pos] = old[sw.PK1], old[sw.PK2]
            msg[sw.SIGS][pos] = old[sw.SIG]

    driver.hostile = replay
    _, _, shared = driver.keys()
    assert KeyTrust(None, {3: keys[3].public_key()}).problem(
        run, rnd, 3, old[sw.PK1], old[sw.PK2], old[sw.SIG]) is None  # valid where it was made
    for i in (0, 1, 2, 4):
        assert shared[i][sw.UNVERIFIED] == [3] and 3 not in shared[i][sw.DSTS]
    total = driver.finish(shared)
    for g, p in zip(total, plain_sum(vectors, [0, 1, 2, 4], 1.0), strict=True):
        np.testing.assert_array_equal(g, p)


def test_a_device_signs_one_key_pair_per_round() -> None:
    """A server asking a device to sign a second key pair for a round (or an older round)
    is refused: it could show different neighbours different signed keys."""
    state = RecordDict()
    assert fresh_round(state, RUN, 3) is None
    assert fresh_round(state, RUN, 3) == (
        f"this device signed its keys for round 3 of run {RUN} already; it signs one key pair "
        "per round, in increasing rounds (asked for round 3)")
    assert fresh_round(state, RUN, 2) is not None
    assert fresh_round(state, RUN, 4) is None
    assert fresh_round(state, RUN + 1, 1) is None  # another run starts afresh


def test_the_statement_binds_every_field() -> None:
    base = statement(RUN, ROUND, 3, b"a", b"bc")
    others = [statement(RUN + 1, ROUND, 3, b"a", b"bc"), statement(RUN, ROUND + 1, 3, b"a", b"bc"),
              statement(RUN, ROUND, 4, b"a", b"bc"), statement(RUN, ROUND, 3, b"ab", b"c"),
              statement(RUN, ROUND, 3, b"a", b"bd")]
    assert len({base, *others}) == 6


# ------------------------------------------------------------------ the device's settings
def write_keys(tmp: Path, ids: list[int]) -> tuple[dict[int, Path], Path]:
    """Each device's OpenSSH private key (as make_certs.sh writes node_key_i) and the
    operator's peer list built from the .pub lines."""
    paths, lines = {}, ["# client id, then its node_key.pub line"]
    for i in ids:
        key = ec.generate_private_key(ec.SECP384R1())
        paths[i] = tmp / f"node_key_{i}"
        paths[i].write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                               serialization.PrivateFormat.OpenSSH,
                                               serialization.NoEncryption()))
        pub = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                            serialization.PublicFormat.OpenSSH).decode()
        lines.append(f"{i} {pub} fedinit-node_key_{i}")
    peers = tmp / "peer-keys.txt"
    peers.write_text("\n".join(lines) + "\n")
    return paths, peers


def query(stage_body: dict[str, Any], server_round: int = 1, cid: int = 0) -> Message:
    set_task_identity()
    msg = Message(content=RecordDict({
        sw.RECORD: ConfigRecord(stage_body),
        rk.CONFIG: ConfigRecord({rk.CLIENT_ID: cid, rk.ROUND: server_round})}),
        dst_node_id=1000 + cid, message_type=MessageType.QUERY)
    msg.metadata.__dict__["_message_id"] = f"q-{server_round}"
    return msg


RUN_CFG: dict[str, Any] = {
    "num-clients": 4, "fraction-train": 1.0, "num-server-rounds": 1, "train-limit": 400,
    "local-epochs": 1, "eval-every": 1, "personal-eval-every": 0, "tracking": "off",
    "weighting": "uniform", "max-update-norm-ratio": 0.0, "secure-aggregation": "secagg+"}


def test_a_device_with_peer_keys_refuses_unsigned_keys_in_one_line(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    paths, peers = write_keys(tmp_path, [0, 1, 2, 3])
    ctx = Context(run_id=RUN, node_id=1000, node_config={
        "partition-id": 0, "num-partitions": 4, "secagg-signing-key": str(paths[0]),
        "secagg-peer-keys": str(peers)}, state=RecordDict(), run_config=dict(RUN_CFG))
    params = SecAggParams(threshold=3, num_shares=5, clip=1.0)
    setup = query({sw.STAGE: Stage.SETUP, sw.SIZES: [3], **params.to_config()})
    reply = query_fn(setup, ctx)
    assert not reply.has_error()
    mine = reply.content.config_records[sw.RECORD]
    assert sw.SIG in mine  # it signs with its node key
    others = [SecAggClient(i).handle({sw.STAGE: Stage.SETUP, sw.SIZES: [3],
                                      **params.to_config()}) for i in (1, 2, 3)]
    unsigned = {sw.STAGE: Stage.SHARE_KEYS, sw.NIDS: [0, 1, 2, 3],
                sw.PK1S: [mine[sw.PK1], *(o[sw.PK1] for o in others)],
                sw.PK2S: [mine[sw.PK2], *(o[sw.PK2] for o in others)]}
    with caplog.at_level(logging.INFO, logger="flwr"):
        refused = query_fn(query(unsigned), ctx)
    want = ("device privacy: refused the secure-aggregation query of round 1: secagg client 0: "
            "the server sent its neighbours' keys without signatures; this device requires "
            "them (secagg-peer-keys)")
    assert refused.has_error() and refused.error.reason == want
    assert [r.getMessage() for r in caplog.records] == [want]


@pytest.mark.parametrize(("node", "pattern"), [
    ({"secagg-peer-keys": "PEERS"}, "^secagg-peer-keys is set without secagg-signing-key"),
    ({"secagg-signing-key": "/nonexistent/key"}, "^secagg-signing-key='/nonexistent/key' is "
                                                 "not a file"),
    ({"secagg-signing-key": "PEERS"}, "^secagg-signing-key=.* is not an unencrypted EC"),
    ({"secagg-signing-key": "KEY1", "secagg-peer-keys": "PEERS"},
     "^secagg client 0: secagg-peer-keys lists another public key for client 0 than this "
     "device's secagg-signing-key: it does not sign keys as that client$"),
])
def test_a_device_with_unusable_key_settings_refuses_the_round_in_one_line(
        tmp_path: Path, node: dict[str, str], pattern: str) -> None:
    paths, peers = write_keys(tmp_path, [0, 1])
    nc = {k: str({"PEERS": peers, "KEY1": paths[1]}.get(v, v)) for k, v in node.items()}
    ctx = Context(run_id=RUN, node_id=1000, node_config={"partition-id": 0,
                  "num-partitions": 4, **nc}, state=RecordDict(), run_config=dict(RUN_CFG))
    params = SecAggParams(threshold=3, num_shares=5, clip=1.0)
    reply = query_fn(query({sw.STAGE: Stage.SETUP, sw.SIZES: [3], **params.to_config()}), ctx)
    assert reply.has_error()
    reason = reply.error.reason.removeprefix(
        "device privacy: refused the secure-aggregation query of round 1: ")
    assert "\n" not in reason
    assert re.search(pattern, reason), reason


@pytest.mark.parametrize(("text", "pattern"), [
    ("0 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl\n",
     "peers:1: the key of client 0 is not an OpenSSH EC public key"),
    ("zero ecdsa-sha2-nistp384 AAAA\n", "peers:1: 'zero ecdsa-sha2-nistp384 AAAA' is not allowed"),
    ("# nobody\n", None),
])
def test_a_bad_peer_list_is_refused_in_one_line(text: str, pattern: str | None) -> None:
    if pattern is None:
        assert parse_peer_keys(text, "peers") == {}
        return
    with pytest.raises(TrustError, match=pattern):
        parse_peer_keys(text, "peers")


def test_a_peer_list_with_one_key_twice_is_refused(tmp_path: Path) -> None:
    _, peers = write_keys(tmp_path, [0])
    line = peers.read_text().splitlines()[1]
    with pytest.raises(TrustError, match=r":3: client 1 has the key of client 0"):
        parse_peer_keys(peers.read_text() + "1" + line[1:] + "\n", str(peers))
    assert trust_of({}).signing_key is None and not trust_of({}).verifies


# ------------------------------------------------------------------ a whole run
def test_a_signed_run_ends_within_the_quantisation_bound_of_the_plain_run(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """4 devices with their keys and the peer list in their node configs: every setup reply
    is signed, every share-keys message relays the signatures, no device leaves anyone out,
    every device signs the survivor set in the consistency check and then unmasks, and the
    model is the plain run's within one quantisation step."""
    paths, peers = write_keys(tmp_path, [0, 1, 2, 3])
    plain_cfg = {**RUN_CFG, "secure-aggregation": "off", "output-dir": str(tmp_path)}
    plain = InProcessGrid(4, plain_cfg)
    run_experiment(plain, RunConfig.parse(plain_cfg), out_dir=tmp_path / "plain")
    cfg = {**RUN_CFG, "output-dir": str(tmp_path)}
    grid = InProcessGrid(4, cfg)
    for i in range(4):
        grid.context_of(i).node_config.update({"secagg-signing-key": str(paths[i]),
                                               "secagg-peer-keys": str(peers)})
    with caplog.at_level(logging.INFO, logger="flwr"):
        run_experiment(grid, RunConfig.parse(cfg), out_dir=tmp_path / "signed")
    lines = [r.getMessage() for r in caplog.records]
    assert "round 1: secure aggregation: 4 of 4 clients signed their keys (relayed to their " \
        "neighbours, who verify them)" in lines
    assert "round 1: secure aggregation: consistency check: 4 of 4 survivors signed the " \
        "survivor set" in lines  # and every device released its shares after it
    protocol = [r.content.config_records[sw.RECORD] for r in grid.replies
                if not r.has_error() and sw.RECORD in r.content.config_records]
    setups = [p for p in protocol if p[sw.STAGE] == Stage.SETUP]
    assert len(setups) == 4 and all(sw.SIG in p for p in setups)
    share = [m.content.config_records[sw.RECORD] for m in grid.sent
             if sw.RECORD in m.content.config_records
             and m.content.config_records[sw.RECORD].get(sw.STAGE) == Stage.SHARE_KEYS]
    assert len(share) == 4 and all(len(m[sw.SIGS]) == 4 and all(m[sw.SIGS]) for m in share)
    assert not any(sw.UNVERIFIED in p for p in protocol)
    checks = [p for p in protocol if p[sw.STAGE] == Stage.CHECK]  # through the node's state
    assert len(checks) == 4 and all(set(p) == {sw.STAGE, sw.SIG} for p in checks)
    assert not [r for r in grid.replies if r.has_error()]
    privacy = RunConfig.parse(cfg).privacy
    step = 2 * privacy.secagg_clip / 2**privacy.secagg_bits
    signed, base = load_checkpoint(tmp_path / "signed"), load_checkpoint(tmp_path / "plain")
    assert signed.rows[-1]["num-replies"] == 4
    gap = max(float(np.max(np.abs(a.astype(np.float64) - b)))
              for a, b in zip(signed.weights, base.weights, strict=True))
    assert 0.0 < gap <= step + 1e-6


# ------------------------------------------------------------------ hostile or unsigned clients
def test_an_unsigned_client_is_dropped_by_every_verifying_neighbour() -> None:
    """Client 4 signs nothing (no device key): the others, each with the list, leave it out
    and report it; the server drops it once and the other four sum exactly."""
    params = SecAggParams(threshold=3, num_shares=5, clip=1.0)
    ids = list(range(5))
    trust = trusts(device_keys(ids))
    trust[4] = KeyTrust()
    vectors = grid_vectors(ids, params, seed=11)
    rnd = Driver(params, ids, vectors, trust)
    setup, share_msgs, shared = rnd.keys()
    assert sw.SIG not in setup[4] and all(m[sw.SIGS][4] == b"" for m in share_msgs.values())
    assert all(shared[i][sw.UNVERIFIED] == [4] for i in range(4))
    assert sw.UNVERIFIED not in shared[4]  # it verifies nothing, so it reports nobody
    total = rnd.finish(shared)
    for g, p in zip(total, plain_sum(vectors, [0, 1, 2, 3], 1.0), strict=True):
        np.testing.assert_array_equal(g, p)
    assert [(cid, why) for cid, _, why in rnd.server.rejected] == [
        (4, "secagg: the signed public keys of client 4 do not verify at [0, 1, 2, 3] "
            "(reported by them in the share-keys stage)")]


def _long_sig(setup: Msgs, shared: Msgs) -> None:
    setup[3][sw.SIG] = bytes(161)


def _report_stranger(setup: Msgs, shared: Msgs) -> None:
    shared[3][sw.UNVERIFIED] = [77]


def _report_but_send(setup: Msgs, shared: Msgs) -> None:
    shared[3][sw.UNVERIFIED] = [0]  # yet it still sent client 0 a ciphertext


@pytest.mark.parametrize(("change", "why"), [
    (_long_sig, "secagg reply from 3: 'sig' has 161 bytes, at most 160 allowed"),
    (_report_stranger, r"secagg reply from 3: 'unverified' \[77\] are not distinct neighbours"),
    (_report_but_send, r"secagg reply from 3: destinations \[0, 1, 2, 4\], its neighbours are "
                       r"\[1, 2, 4\]"),
])
def test_a_malformed_signature_or_report_drops_only_its_sender(
        change: Callable[[Msgs, Msgs], None], why: str) -> None:
    params = SecAggParams(threshold=3, num_shares=5, clip=1.0)
    ids = list(range(5))
    vectors = grid_vectors(ids, params, seed=12)
    rnd = Driver(params, ids, vectors, trusts(device_keys(ids)))
    setup = rnd.ask(rnd.server.setup_messages())
    shared: Msgs = {}
    if change is _long_sig:
        change(setup, shared)
    shared = rnd.ask(rnd.server.share_keys_messages(setup))
    if change is not _long_sig:
        change(setup, shared)
    total = rnd.finish(shared)
    for g, p in zip(total, plain_sum(vectors, [0, 1, 2, 4], 1.0), strict=True):
        np.testing.assert_array_equal(g, p)
    assert [cid for cid, _, _ in rnd.server.rejected] == [3]
    assert re.search(why, rnd.server.rejected[0][2]), rnd.server.rejected
