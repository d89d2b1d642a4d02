"""The operator's page as a docker-compose service (fast: the compose file is read, no Docker):
it reads the ServerApp's results read-only, is published on the host's 127.0.0.1 only, shares
no network with the SuperLink or the nodes, and runs on an image that holds what it imports."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
import yaml

from fedinit.cli.flower_env import REPO


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    with (REPO / "docker-compose.yml").open() as f:
        return dict(yaml.safe_load(f))


def networks_of(service: dict[str, Any]) -> set[str]:
    nets = service.get("networks") or []
    return set(nets) if isinstance(nets, list) else set(nets)


def test_the_dashboard_reads_the_servers_results_read_only(compose: dict[str, Any]) -> None:
    dash = compose["services"]["dashboard"]
    assert dash["read_only"] is True and dash["cap_drop"] == ["ALL"]
    mounts = {v.split(":")[-2]: v for v in dash["volumes"]}
    assert all(v.endswith(":ro") for v in dash["volumes"]), dash["volumes"]
    server = compose["services"]["superexec-serverapp"]
    results = next(v for v in server["volumes"] if v.split(":")[-1] == "/results")
    assert mounts["/results"] == results + ":ro"  # the very directory the ServerApp writes
    assert dash["command"][:4] == ["python", "-m", "fedinit.cli.dashboard", "/results"]


def test_the_dashboard_is_published_on_loopback_only_and_alone(
        compose: dict[str, Any]) -> None:
    services = compose["services"]
    dash = services["dashboard"]
    assert dash["ports"] and all(str(p).startswith("127.0.0.1:") for p in dash["ports"])
    assert [n for n, s in services.items() if s.get("ports")] == ["dashboard"]
    mine = networks_of(dash)
    assert mine == {"operator"}
    for name, service in services.items():
        if name != "dashboard":
            assert not mine & networks_of(service), name  # no node, link or executor
    operator = compose["networks"]["operator"]
    assert operator["driver_opts"]["com.docker.network.bridge.enable_ip_masquerade"] == "false"
    assert dash["profiles"] == ["dashboard"]  # started only when the operator asks


def test_the_flwr_image_holds_everything_the_page_imports(compose: dict[str, Any]) -> None:
    """The dashboard runs on the superlink image (flwr and numpy, no torch): importing the
    page must not need torch or anything else only the client or server images hold."""
    assert compose["services"]["dashboard"]["image"] == compose["x-image-flwr"]
    code = ("import sys, fedinit.cli.dashboard; print(sorted({m.split('.')[0] for m in "
            "sys.modules} & {'torch', 'matplotlib', 'dp_accounting', 'prometheus_client', "
            "'PIL'}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stdout
