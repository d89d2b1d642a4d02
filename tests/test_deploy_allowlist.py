"""A device runs only the apps its owner approved, deployed (127.0.0.1, no TLS, 2 nodes: one
with the warm executor, one with Flower's ``flower-superexec``).

Each node's approved-apps file holds this app's FAB hash (``python -m fedinit.node.approve_app``).
The app runs; then a copy whose ClientApp module writes a marker file when it is imported is
submitted: every node refuses it with the one line (the ServerApp sees the refusal as the
nodes' error replies), none installs or imports a line of it (no marker, no app directory of
its hash), and the approved app's next run trains exactly as its first did.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedinit.cli.deploy_local import Deployment
from fedinit.cli.flower_env import REPO
from fedinit.node.app_allowlist import fab_hash
from fedinit.node.approve_app import fab_of
from testbeds.deployment_runs import FlwrRun, deployed
from testbeds.fault_app import fault_app
from tests.deploy_helpers import diffs, rounds, run_dir

BASE_PORT = int(os.environ.get("FEDINIT_TEST_ALLOWLIST_BASE_PORT", "29870"))
NODES = 2
TOLERANCE = {"test-acc": 5e-4, "test-loss": 1e-5, "divergence": 1e-5, "train-loss": 1e-5}
"""As tests/test_deploy_process.py: the same config and seed twice differ only by the
order in which float32 replies are summed."""


class ApprovedDeployment(Deployment):
    """Node i gets ``approved-apps=<file>``; node 1 runs Flower's own executor."""

    approved: Path = Path()

    def node_command(self, i: int, *args: object, **kwargs: object) -> list[str]:
        cmd = super().node_command(i, *args, **kwargs)  # type: ignore[arg-type]
        cmd[cmd.index("--node-config") + 1] += f' approved-apps="{self.approved}"'
        if i == 1:
            cmd[cmd.index("--executor") + 1] = "flower"
        return cmd


def marker_app(dest: Path, marker: Path) -> Path:
    """A copy of the app whose ClientApp module writes ``marker`` when it is imported (its
    first statement after ``from __future__``, which must stay first)."""
    fault_app(dest)
    module = dest / "client_app" / "app.py"
    future = "from __future__ import annotations\n"
    text = module.read_text()
    assert text.count(future) == 1, "client_app/app.py changed: update the marker anchor"
    module.write_text(text.replace(
        future, future + f"open({str(marker)!r}, 'a').write('imported\\n')\n", 1))
    return dest


def writes_marker(app: Path, marker: Path) -> bool:
    """Whether importing ``app``'s ClientApp module writes ``marker`` (then removed): the
    absence of the marker after the deployment means something only if it does."""
    subprocess.run([sys.executable, "-c", "import client_app.app"], cwd=app, check=True,
                   env={**os.environ, "PYTHONPATH": str(app)}, capture_output=True,
                   timeout=120)
    written = marker.exists()
    marker.unlink(missing_ok=True)
    return written


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[ApprovedDeployment]:
    dep = ApprovedDeployment(tmp_path / "deploy", NODES, base_port=BASE_PORT, insecure=True)
    dep.approved = tmp_path / "approved-apps.txt"
    approve = subprocess.run([sys.executable, "-m", "fedinit.node.approve_app", str(REPO),
                              "--append", str(dep.approved)],
                             capture_output=True, text=True, check=False, timeout=120)
    assert approve.returncode == 0, approve.stderr
    with deployed(dep, tmp_path):
        yield dep


@pytest.mark.slow
def test_an_unapproved_app_is_refused_and_the_approved_one_trains_on(
        deployment: ApprovedDeployment, tmp_path: Path) -> None:
    dep = deployment
    approved_hash = fab_hash(fab_of(REPO))
    assert approved_hash in dep.approved.read_text()
    cfg = {"num-clients": NODES, "fraction-train": 1.0, "num-server-rounds": 2,
           "train-limit": 600, "local-epochs": 1, "seed": 0}

    first = FlwrRun(dep, "approved-1", {**cfg, "output-dir": str(tmp_path / "out1")})
    assert first.wait(300) == "finished:completed", first.text()[-3000:]

    marker = tmp_path / "imported.marker"
    other = marker_app(tmp_path / "other-app", marker)
    assert writes_marker(other, marker)
    other_hash = fab_hash(fab_of(other))
    assert other_hash != approved_hash
    hostile = FlwrRun(dep, "unapproved", {**cfg, "node-wait-timeout": 15.0,
                                          "output-dir": str(tmp_path / "out-hostile")},
                      app=other)
    hostile_id = hostile.run_id()
    status = hostile.wait(300)
    text = hostile.text()
    assert status != "finished:completed", text[-3000:]
    line = f"app allowlist: refused run {hostile_id}: FAB {other_hash} is not in {dep.approved}"
    assert text.count(line) >= NODES, text[-3000:]  # the ServerApp saw each node's refusal
    for i in range(NODES):
        log = (dep.logs / f"supernode-{i}.log").read_text()
        assert line in log, (i, log[-3000:])
        apps = dep.work_dir / f"node-{i}" / "apps"
        installed = [p.name.rsplit(".", 1)[-1] for p in apps.glob("*")]
        assert approved_hash[:8] in installed, (i, installed)  # where an app would be
        assert other_hash[:8] not in installed, (i, installed)
    assert not marker.exists(), "a device imported the unapproved app"

    second = FlwrRun(dep, "approved-2", {**cfg, "output-dir": str(tmp_path / "out2")})
    assert second.wait(300) == "finished:completed", second.text()[-3000:]
    a, b = rounds(run_dir(tmp_path / "out1")), rounds(run_dir(tmp_path / "out2"))
    assert len(b) == 2 and all(r["num-replies"] == NODES for r in b), b
    diff = diffs(a, b)
    print("\nsecond approved run vs first:", diff)
    assert all(diff[k] <= TOLERANCE[k] for k in diff), diff
    assert not marker.exists()
