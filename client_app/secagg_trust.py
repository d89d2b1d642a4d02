"""Whom a device believes under secure aggregation: its own signing key and the operator's list
of client ids and public keys, both from the node's own config, never from the run config.

The server relays every SecAgg+ public key, so without signatures it can swap a neighbour's
keys for its own and unmask a device (docs/faults.md, threat table). Node config keys:

    secagg-signing-key="/keys/node_key"        the device's EC private key (OpenSSH, e.g.
                                               the SuperNode's auth key, or PEM); it signs
                                               (run, round, client id, pk1, pk2) each round
    secagg-peer-keys="/etc/fedinit/peers.txt"  client id -> public key, one a line:
                                               <client id> ecdsa-sha2-nistp384 AAAA... [note]

With a peer list the device REQUIRES signed keys: a neighbour whose signature does not verify
under its listed key (or that is not listed, or unsigned) is left out and reported; a server
that sends no signatures at all is refused with one line. The files are read at every
secure-aggregation query, so a new list applies at the next round; a file that cannot be used
refuses every such query (fail closed), never runs without it. deploy/edge/README.md,
"Signed keys for secure aggregation".
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import (
    load_pem_private_key,
    load_ssh_private_key,
    load_ssh_public_key,
)
from flwr.app import ConfigRecord, RecordDict
from flwr.supercore.primitives.asymmetric import uses_nist_ec_curve

from fedinit.secure_aggregation.signing import KeyTrust

SIGNING_KEY = "secagg-signing-key"
PEER_KEYS = "secagg-peer-keys"
SIGNED = "secagg-signed"
"""The ``context.state`` record of the last (run, round) this device signed keys for."""


class TrustError(ValueError):
    """The device's key settings cannot be used (one line naming the key or file and line)."""


def trust_of(node_config: Mapping[str, Any]) -> KeyTrust:
    """The device's ``KeyTrust`` from its node config; TrustError when a setting is bad."""
    signing, peers = _path(node_config, SIGNING_KEY), _path(node_config, PEER_KEYS)
    if peers is not None and signing is None:
        raise TrustError(f"{PEER_KEYS} is set without {SIGNING_KEY}; allowed: both (a device "
                         "that requires signed keys signs its own) or only "
                         f"{SIGNING_KEY}")
    return KeyTrust(None if signing is None else load_signing_key(signing),
                    None if peers is None else load_peer_keys(peers))


def load_signing_key(path: Path) -> ec.EllipticCurvePrivateKey:
    """An EC private key on a NIST curve: OpenSSH format (Flower's node auth key), or PEM."""
    data = _read(path, SIGNING_KEY).encode()
    key: object = None
    for load in (lambda: load_ssh_private_key(data, None),
                 lambda: load_pem_private_key(data, None)):
        try:
            key = load()
            break
        except (ValueError, TypeError, UnsupportedAlgorithm):
            continue
    if not isinstance(key, ec.EllipticCurvePrivateKey) or not uses_nist_ec_curve(
            key.public_key()):
        raise TrustError(f"{SIGNING_KEY}={str(path)!r} is not an unencrypted EC private key "
                         "on a NIST curve; allowed: OpenSSH (ssh-keygen -t ecdsa) or PEM")
    return key


def parse_peer_keys(text: str, where: str) -> dict[int, ec.EllipticCurvePublicKey]:
    """``<client id> <OpenSSH public key line>`` per line, ``#`` comments and blank lines
    skipped; an id or a key listed twice is refused (one device, one client)."""
    peers: dict[int, ec.EllipticCurvePublicKey] = {}
    seen: dict[tuple[int, int], int] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(maxsplit=1)
        at = f"{where}:{number}"
        if len(parts) != 2 or not parts[0].isdigit():
            raise TrustError(f"{at}: {line[:60]!r} is not allowed; allowed: '<client id> "
                             "ecdsa-sha2-nistp384 AAAA... [comment]' (a node_key.pub line)")
        cid = int(parts[0])
        try:
            key = load_ssh_public_key(parts[1].encode())
        except (ValueError, UnsupportedAlgorithm):
            key = None
        if not isinstance(key, ec.EllipticCurvePublicKey) or not uses_nist_ec_curve(key):
            raise TrustError(f"{at}: the key of client {cid} is not an OpenSSH EC public key on "
                             "a NIST curve; allowed: a node_key.pub line (ssh-keygen -t ecdsa)")
        if cid in peers:
            raise TrustError(f"{at}: client {cid} is listed twice; allowed: one key per client")
        numbers = key.public_numbers()
        if (numbers.x, numbers.y) in seen:
            raise TrustError(f"{at}: client {cid} has the key of client "
                             f"{seen[(numbers.x, numbers.y)]}; allowed: one client per key")
        peers[cid], seen[(numbers.x, numbers.y)] = key, cid
    return peers


def load_peer_keys(path: Path) -> dict[int, ec.EllipticCurvePublicKey]:
    """The operator's list at ``path`` (an empty one is refused: it would trust nobody)."""
    peers = parse_peer_keys(_read(path, PEER_KEYS), str(path))
    if not peers:
        raise TrustError(f"{PEER_KEYS}={str(path)!r} lists no client; allowed: one "
                         "'<client id> <public key>' line per client of the federation")
    return peers


def fresh_round(state: RecordDict, run_id: int, server_round: int) -> str | None:
    """Why this device must not sign keys for ``server_round`` of run ``run_id`` (it did so
    for that round or a later one of the run already: one key pair per round, so a server
    can never hold two signed key pairs of one device for one round), or None; a round
    that may be signed is recorded as signed."""
    rec = state.config_records.get(SIGNED)
    last = int(rec["round"]) if rec is not None and rec.get("run-id") == run_id else -1  # type: ignore[arg-type]
    if last >= server_round:
        return (f"this device signed its keys for round {last} of run {run_id} "
                f"already; it signs one key pair per round, in increasing rounds (asked for "
                f"round {server_round})")
    state.config_records[SIGNED] = ConfigRecord({"run-id": run_id, "round": server_round})
    return None


def _path(node_config: Mapping[str, Any], key: str) -> Path | None:
    value = node_config.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise TrustError(f"{key}={value!r} is not allowed; allowed: a file path")
    path = Path(value).expanduser()
    if not path.is_file():
        raise TrustError(f"{key}={value!r} is not a file; allowed: the path of a readable file")
    return path


def _read(path: Path, key: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise TrustError(f"{key}={str(path)!r} cannot be read: {type(err).__name__}: "
                         f"{' '.join(str(err).split())}") from None
