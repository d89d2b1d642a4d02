"""``examples/tabular-quickstart`` under ``flwr run`` (simulation, offline, its own ports):
as shipped (Flower's FedAvg), then switched to FedInit, SCAFFOLD and FedDyn by its strategy
line and one line of its ClientApp; each run completes above chance accuracy, and each
client's files show its method state, w_prev first, kept from one participation to the
next. Slow: every run starts a SuperLink and Ray.

The example runs as a user runs it: against the project's wheel, built from this checkout
and installed (not editable) into a fresh environment (``tests/installed_wheel.py``), from a
directory outside the checkout, with nothing of the checkout on the path.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from fedinit.cli.flower_env import REPO, flower_env
from fedinit.cli.superlink_port import CONTROL_PORT_ENV, HTTP_PORT_ENV
from fedinit.methods.feddyn import H_LOCAL
from fedinit.methods.scaffold import C_LOCAL
from fedinit.store.client_store import W_PREV
from fedinit.store.state_dir import StateDir
from tests.conftest import free_ports, kill_local_superlink
from tests.installed_wheel import TOP_LEVEL, build_wheel, fresh_environment, installed_env
from tests.installed_wheel import site_packages as wheel_site

EXAMPLE = REPO / "examples" / "tabular-quickstart"
STRATEGY_LINE = "    strategy = FedAvg(**settings)  # the strategy line"
TRAINING_LINE = "    return plain_train(msg, net, loader, epochs)  # the training line"
METHOD_LINE = ("    return method_train(msg, context, net, loader, epochs=epochs, "
               "**keep_state(context))")
SWITCHES = {
    "FedAvg": None,
    "FedInit": "    strategy = FedInit(beta=0.1, **settings)",
    "Scaffold": "    strategy = Scaffold(**settings)",
    "FedDyn": "    strategy = FedDyn(alpha=0.1, **settings)",
}
STATE = {"FedInit": {W_PREV}, "Scaffold": {W_PREV, C_LOCAL}, "FedDyn": {W_PREV, H_LOCAL}}
CHANCE = 0.25  # 4 balanced classes in the test set
NODES = 10


@pytest.fixture(scope="module")
def wheel_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bin directory of a fresh environment with the checkout's wheel installed."""
    root = tmp_path_factory.mktemp("wheel")
    return fresh_environment(root / "env", build_wheel(root))


@pytest.fixture
def env(tmp_path: Path, wheel_bin: Path) -> Iterator[dict[str, str]]:
    """The offline Flower environment of the installed wheel, with a private home and local
    SuperLink ports."""
    http, control = (str(port) for port in free_ports(2))
    environment = installed_env(wheel_bin, flower_env(
        tmp_path / "flwr-home", **{HTTP_PORT_ENV: http, CONTROL_PORT_ENV: control}))
    yield environment
    kill_local_superlink(http)


@pytest.mark.slow
def test_the_wheel_installs_the_card_packages_and_one_namespace(
        tmp_path: Path, env: dict[str, str], wheel_bin: Path) -> None:
    """No generic ``task``, ``cli`` or ``store`` at the top of a user's site-packages; from
    outside the checkout the strategies import from the wheel and read the run-config
    defaults the wheel carries."""
    site = wheel_site(wheel_bin.parent)
    assert {p.name for p in site.iterdir() if p.is_dir() and not p.name.endswith(
        (".dist-info", "__pycache__"))} == TOP_LEVEL
    code = ("import strategies, fedinit, fedinit.config.defaults as d; "
            "s = strategies.FedInit(beta=0.1, lr=0.05); "
            "print(strategies.__file__, *fedinit.__path__, d.defaults_file(), sep='\\n')")
    out = subprocess.run([str(wheel_bin / "python"), "-c", code], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120, check=True).stdout
    files = [Path(line) for line in out.split()]
    assert len(files) == 3 and all(f.is_relative_to(site) for f in files), out
    assert not any(f.is_relative_to(REPO) for f in files), out


def switch(app: Path, name: str) -> None:
    """Rewrite ``app`` (a copy of the example) as the example with its strategy line and its
    training line switched to ``name``; exactly those two lines differ from the shipped app.

    One directory for every run, edited in place as a user would: the local SuperLink keeps
    the directory of the first ``flwr run`` as its working directory, and Ray's workers
    (which import the ClientApp) put that directory on their path, so a second app in
    another directory would run the first one's ClientApp.
    """
    line = SWITCHES[name]
    changed = 0
    for rel, old, new in (("server_app.py", STRATEGY_LINE, line),
                          ("client_app.py", TRAINING_LINE, METHOD_LINE)):
        shipped = (EXAMPLE / "tabular_quickstart" / rel).read_text()
        assert shipped.count(old + "\n") == 1, (rel, old)
        text = shipped if line is None else shipped.replace(old + "\n", new + "\n")
        (app / "tabular_quickstart" / rel).write_text(text)
        changed += sum(a != b for a, b in zip(shipped.splitlines(), text.splitlines(),
                                               strict=True))
    assert changed == (0 if line is None else 2)


def example_task() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "tabular_quickstart_task", EXAMPLE / "tabular_quickstart" / "task.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_state(root: Path, keys: set[str], w0: list[np.ndarray]) -> int:
    """Every trained client's state files hold ``keys``; w_prev is a trained model, and it
    moved between a client's two kept participations. Returns how many clients kept two."""
    runs = sorted(root.iterdir())
    assert len(runs) == 1, runs  # one experiment: the run's id
    clients = sorted(runs[0].glob("client-*"))
    assert 0 < len(clients) <= NODES
    twice = 0
    for client in clients:
        store = StateDir(root, runs[0].name, int(client.name.removeprefix("client-")))
        rounds = sorted(int(p.stem[1:]) for p in client.glob("r*.npz"))
        versions = [store.load_version(r, w0) for r in rounds]
        for entries in versions:
            assert keys <= set(entries), (client, sorted(entries))
            assert not all(np.array_equal(a, b) for a, b in zip(entries[W_PREV], w0,
                                                                 strict=True))
        if len(versions) == 2:
            twice += 1
            assert not all(np.array_equal(a, b) for a, b in zip(
                versions[0][W_PREV], versions[1][W_PREV], strict=True))
    return twice


@pytest.mark.slow
def test_the_example_switches_from_fedavg_to_fedinit_scaffold_and_feddyn(
        tmp_path: Path, env: dict[str, str], wheel_bin: Path) -> None:
    w0 = example_task().initial_weights()
    accuracy: dict[str, float] = {}
    app = tmp_path / "app"
    shutil.copytree(EXAMPLE, app, ignore=shutil.ignore_patterns("__pycache__"))
    for name in SWITCHES:
        switch(app, name)
        state = tmp_path / f"state-{name}"
        t0 = time.monotonic()
        proc = subprocess.run(
            [str(wheel_bin / "flwr"), "run", ".", "--federation-config", f"num-supernodes={NODES}",
             "--run-config", f"state-dir='{state}'", "--stream"],
            cwd=app, env=env, capture_output=True, text=True, timeout=600, check=False)
        out = proc.stdout + proc.stderr
        (tmp_path / f"{name}.log").write_text(out)
        found = re.search(rf"{name}: final accuracy ([0-9.]+)", out)
        assert found, out[-4000:]
        accuracy[name] = float(found.group(1))
        print(f"{name}: final accuracy {accuracy[name]:.4f} "
              f"({time.monotonic() - t0:.0f} s)")
        assert accuracy[name] > CHANCE + 0.2, out[-4000:]
        if name in STATE:
            assert check_state(state, STATE[name], w0) > 0
        else:
            assert not state.exists()  # Flower's FedAvg client keeps nothing
    listing = subprocess.run([str(wheel_bin / "flwr"), "ls", "--format", "json"], cwd=tmp_path,
                             env=env, capture_output=True, text=True, check=False).stdout
    runs = json.loads(listing[listing.index("{"):])["runs"]
    assert [r["status"] for r in runs] == ["finished:completed"] * len(SWITCHES)
