"""Signed SecAgg+ keys as the deployments wire them (fast: no Docker, no Flower process).

make_certs.sh writes the operator's peer list from the node keys it made; every SuperNode of
docker-compose (and of its device-data variant) and the edge kit's run-docker.sh hand their
node the two node-config keys. Each check follows the paths a node would read to the files
on the host and asks the device's own loader (client_app/secagg_trust.py) whether the node
signs as its own client id under the listed key.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from client_app.secagg_trust import PEER_KEYS, SIGNING_KEY, trust_of
from fedinit.cli.flower_env import REPO
from fedinit.node.launch import node_config_of

MAKE_CERTS = REPO / "deploy" / "make_certs.sh"
KEYS_IN_NODE = {SIGNING_KEY: "/keys/node_key", PEER_KEYS: "/keys/secagg-peer-keys.txt"}


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("certs")
    subprocess.run(["bash", str(MAKE_CERTS), "-n", "3", str(out)], check=True,
                   capture_output=True)
    return out


def test_make_certs_lists_each_node_key_under_its_client_id(certs: Path) -> None:
    peers = certs / "secagg-peer-keys.txt"
    lines = [ln for ln in peers.read_text().splitlines() if not ln.startswith("#")]
    assert lines == [f"{i} {(certs / f'node_key_{i}.pub').read_text().strip()}"
                     for i in range(3)]
    assert stat.S_IMODE(peers.stat().st_mode) == 0o644  # public: every device reads it
    for i in range(3):
        trust = trust_of({SIGNING_KEY: str(certs / f"node_key_{i}"), PEER_KEYS: str(peers)})
        assert trust.verifies and trust.own_key_problem(i) is None
        assert trust.own_key_problem((i + 1) % 3) is not None  # another node's id: refused


def test_make_certs_rewrites_the_list_for_the_nodes_asked_and_keeps_the_keys(
        tmp_path: Path) -> None:
    subprocess.run(["bash", str(MAKE_CERTS), "-n", "3", str(tmp_path)], check=True,
                   capture_output=True)
    key0 = (tmp_path / "node_key_0.pub").read_text()
    subprocess.run(["bash", str(MAKE_CERTS), "-n", "2", str(tmp_path)], check=True,
                   capture_output=True)
    listed = [ln.split()[0] for ln in (tmp_path / "secagg-peer-keys.txt").read_text()
              .splitlines() if not ln.startswith("#")]
    assert listed == ["0", "1"]
    assert (tmp_path / "node_key_0.pub").read_text() == key0  # registered keys stay valid


def host_path(volumes: list[str], inside: str, work: Path) -> Path:
    """The host file a service mounts at ``inside``, FEDINIT_WORK taken as ``work``."""
    source = next(v.rsplit(":", 2)[0] for v in volumes if v.rsplit(":", 2)[1] == inside)
    assert next(v for v in volumes if v.rsplit(":", 2)[1] == inside).endswith(":ro")
    return Path(source.replace("${FEDINIT_WORK:-./deploy/.build/compose}", str(work)))


def defaults(args: list[str]) -> list[str]:
    """Compose's ``${VAR:-default}`` taken at its default, as with no such variable set."""
    return [re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", a) for a in args]


def supernodes(compose_file: str) -> dict[str, dict[str, Any]]:
    with (REPO / compose_file).open() as f:
        services = yaml.safe_load(f)["services"]
    return {name: s for name, s in services.items() if name.startswith("supernode-")}


@pytest.mark.parametrize("compose_file", ["docker-compose.yml", "docker-compose.device-data.yml"])
def test_every_compose_node_signs_as_its_own_client_with_the_listed_key(
        compose_file: str, certs: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "certs").symlink_to(certs)
    base = supernodes("docker-compose.yml")
    nodes = supernodes(compose_file)
    assert sorted(nodes) == ["supernode-0", "supernode-1", "supernode-2"]
    for name, service in nodes.items():
        config = node_config_of(defaults(service["command"]))
        assert {k: config.get(k) for k in KEYS_IN_NODE} == KEYS_IN_NODE, (name, config)
        volumes = base[name]["volumes"]  # the override adds its data mount only
        files = {k: str(host_path(volumes, inside, work)) for k, inside in KEYS_IN_NODE.items()}
        client = int(str(config["partition-id"]))
        assert trust_of(files).own_key_problem(client) is None, (name, files)


def fake_docker(tmp_path: Path) -> dict[str, str]:
    """PATH with a `docker` that only records its arguments, one a line."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    docker = bin_dir / "docker"
    docker.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {tmp_path / "docker-args"}\n')
    docker.chmod(0o755)
    return dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")


def run_edge_kit(tmp_path: Path, certs: Path, peer_keys: str) -> list[str]:
    tmp_path.mkdir()
    env_file = tmp_path / "node.env"
    env_file.write_text("\n".join([
        "SUPERLINK=superlink:9092", "PARTITION_ID=1", "NUM_PARTITIONS=3",
        f"KEY={certs / 'node_key_1'}", f"CA={certs / 'ca.crt'}", f"PEER_KEYS={peer_keys}",
        f"DATA_DIR={tmp_path}", f"STATE_DIR={tmp_path / 'state'}", "IMAGE=img", "NAME=n",
        "CPUS=1", "MEMORY=1g", "NETWORK=bridge", ""]))
    proc = subprocess.run(["bash", str(REPO / "deploy" / "edge" / "run-docker.sh"),
                           str(env_file)], env=fake_docker(tmp_path), capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    return (tmp_path / "docker-args").read_text().splitlines()


@pytest.mark.skipif(os.geteuid() != 0, reason="run-docker.sh chowns the key as root only")
def test_the_edge_kit_signs_only_with_a_peer_list(certs: Path, tmp_path: Path) -> None:
    own = tmp_path / "certs"
    shutil.copytree(certs, own)  # run-docker.sh gives the key to the image's user
    args = run_edge_kit(tmp_path / "signed", own, str(own / "secagg-peer-keys.txt"))
    config = node_config_of(args)
    assert {k: config.get(k) for k in KEYS_IN_NODE} == KEYS_IN_NODE
    assert f"{own / 'secagg-peer-keys.txt'}:/keys/secagg-peer-keys.txt:ro" in args
    plain = node_config_of(run_edge_kit(tmp_path / "plain", own, ""))
    assert SIGNING_KEY not in plain and PEER_KEYS not in plain
    assert plain["partition-id"] == 1
