"""The newcomer's path: idempotent setup, Flower's offline settings for plain `flwr run .`,
this checkout's own SuperLink ports, clean streamed logs."""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import time
import tomllib
from pathlib import Path

import pytest

from fedinit.cli.flower_env import OFFLINE_ENV, REPO, flower_env
from fedinit.cli.flower_output import clean_line
from fedinit.cli.superlink_port import (
    CONTROL_PORT_ENV,
    HTTP_PORT_ENV,
    checkout_ports,
    foreign_superlink,
)
from fedinit.config import load_defaults
from fedinit.scripts.flower_setup import (
    BEGIN,
    CONNECTION,
    activate_block,
    flower_config,
    install,
    with_block,
)

SETUP = REPO / "scripts" / "setup.sh"
STAMP = REPO / ".venv" / ".fedinit-installed"


def _digest(paths: list[Path]) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() + f"@{p.stat().st_mtime_ns}"
            for p in paths if p.is_file()}


@pytest.mark.slow
@pytest.mark.skipif(not STAMP.is_file(), reason="scripts/setup.sh has not run in this checkout")
def test_second_setup_changes_nothing_and_is_fast() -> None:
    """What .ci/run and the quick start rely on: setup can be run again at no cost. Slow: it
    runs scripts/setup.sh (pip into this checkout's venv, whichever checkout that venv was
    installed from) twice, end to end."""
    subprocess.run([str(SETUP)], check=True, capture_output=True, timeout=600)
    watched = [STAMP, REPO / ".venv" / "bin" / "activate", REPO / ".flwr" / "config.toml"]
    before = _digest(watched)
    t0 = time.monotonic()
    proc = subprocess.run([str(SETUP)], check=True, capture_output=True, text=True, timeout=60)
    assert time.monotonic() - t0 < 10.0
    assert _digest(watched) == before
    assert "wrote" not in proc.stdout


def test_activate_block_is_replaced_not_repeated() -> None:
    text = "# venv activate\n"
    once = with_block(text, activate_block())
    assert with_block(once, activate_block()) == once
    assert once.count(BEGIN) == 1
    for key, value in OFFLINE_ENV.items():
        assert f"export {key}={value}" in once


def test_flower_config_sizes_plain_flwr_run_to_num_clients(tmp_path: Path) -> None:
    config = tomllib.loads(flower_config(int(load_defaults()["num-clients"])))
    assert config["superlink"]["default"] == CONNECTION
    conn = config["superlink"][CONNECTION]
    assert conn["address"] == ":local:"
    assert conn["options"]["num-supernodes"] == load_defaults()["num-clients"]
    assert config["superlink"]["local"] == {"address": ":local:"}  # what fedinit-simulate uses


def test_install_leaves_a_foreign_flower_config_alone(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").write_text("# activate\n")
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text("[superlink]\ndefault = \"mine\"\n")
    assert install(venv, home) == [str(venv / "bin" / "activate")]
    assert (home / "config.toml").read_text() == "[superlink]\ndefault = \"mine\"\n"
    assert install(venv, home) == []


def test_install_replaces_the_default_flower_writes(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").write_text("# activate\n")
    (home / "config.toml").write_text(  # flwr/cli/constant.py DEFAULT_FLOWER_CONFIG_TOML
        '[superlink]\ndefault = "local"\n\n[superlink.supergrid]\naddress = "api.flower.ai"\n'
        '\n[superlink.local]\naddress = ":local:"\n')
    assert str(home / "config.toml") in install(venv, home)
    assert CONNECTION in (home / "config.toml").read_text()


def test_checkout_ports_are_its_own() -> None:
    http, control = checkout_ports(REPO)
    assert (http, control) == checkout_ports(REPO)
    assert {http, control}.isdisjoint({"39091", "39093"})  # Flower's defaults, shared by all
    assert checkout_ports(REPO.parent / "another-checkout") != (http, control)
    env = {k: v for k, v in os.environ.items() if k not in (HTTP_PORT_ENV, CONTROL_PORT_ENV)}
    saved = dict(os.environ)
    try:
        os.environ.clear()
        os.environ.update(env)
        assert flower_env()[HTTP_PORT_ENV] == http
    finally:
        os.environ.clear()
        os.environ.update(saved)


def test_a_port_held_by_something_else_is_refused(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = str(sock.getsockname()[1])
        env = {HTTP_PORT_ENV: port, "FLWR_HOME": str(tmp_path)}
        problem = foreign_superlink(env, OFFLINE_ENV)
    assert problem is not None and f"127.0.0.1:{port}" in problem
    assert foreign_superlink(env, OFFLINE_ENV) is None  # closed again: free


def test_streamed_log_lines_are_cleaned() -> None:
    line = "\x1b[92mINFO \x1b[0m:      [round 1/2] acc 19.54%\n"
    assert clean_line(line, colour=False) == "INFO :      [round 1/2] acc 19.54%\n"
    assert clean_line(line, colour=True) == line
    warning = "\x1b[93mWARNING \x1b[0m:   Since flwr 1.32, default simulated SuperNodes " \
              "changed from 10 to 2.\n"
    assert clean_line(warning, colour=False) is None


def readme_quick_start() -> list[str]:
    """The two commands of the README's quick start block."""
    text = (REPO / "README.md").read_text()
    block = text.split("## Quick start", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].strip() for line in block.strip().splitlines()]


README_MAX_LINES = 250  # issue 43: a README a newcomer reads to the end; the rest is in docs/


def test_readme_is_short_enough_to_read_to_the_end() -> None:
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): move the detail into "
        "docs/ (running.md, configuration.md, results.md) and leave a pointer")


def test_readme_quick_start_is_two_commands_and_ci_runs_the_second() -> None:
    setup_and_run, tests = readme_quick_start()
    assert setup_and_run == "scripts/setup.sh && .venv/bin/fedinit-simulate"
    assert tests == "scripts/test.sh"
    assert "scripts/test.sh" in (REPO / ".ci" / "run").read_text()


@pytest.mark.slow
@pytest.mark.skipif(not (REPO / ".venv" / "bin" / "fedinit-simulate").is_file(),
                    reason="scripts/setup.sh has not run in this checkout")
def test_readme_run_command_with_a_tiny_override(sim_env: dict[str, str],
                                                 tmp_path: Path) -> None:
    run = readme_quick_start()[0].split("&&")[1].split()
    proc = subprocess.run([*run, "num-clients=4", "fraction-train=0.5", "num-server-rounds=1",
                           "train-limit=400", f"output-dir={tmp_path}"], cwd=REPO,
                          env=sim_env, capture_output=True,
                          text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "[round 1/1] acc" in proc.stdout
    assert "\x1b[" not in proc.stdout  # no colour codes in captured output
    assert "changed from 10 to 2" not in proc.stdout
