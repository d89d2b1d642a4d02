"""The docker-compose deployment: images built offline, TLS + node auth, an edge node, and
the same stack with device data (each SuperNode its own read-only folder).

The machine needs root (to install docker.io, docker-compose and debootstrap with apt and
start dockerd when no engine runs, as on a fresh CI machine). The first run builds the
images from scratch (debootstrap + wheels + 3 images, ~7 min here); later runs reuse them.
Nothing leaves the machine: images build with --network none from local wheels and the
stack runs on an internal network with no published port.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from fedinit.cli.flower_env import REPO
from fedinit.task.data_paths import default_data_dir
from fedinit.task.datasets import load_dataset
from tests.conftest import free_ports
from tests.deploy_helpers import (
    DockerEngine,
    check_published_ports,
    docker_session,
    rounds,
    run_dir,
    sh,
)
from tests.device_data import FMNIST_CLASSES, skewed_fmnist_folders

PREFIX, TAG = "local/fedinit", "flwr1.39.0"
IMAGES = ("superlink", "client-cpu", "serverapp")
PROJECT = f"fedinit-test-{os.getpid()}"


@pytest.fixture(scope="module")
def docker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DockerEngine]:
    yield from docker_session(tmp_path_factory.mktemp("docker"), PROJECT)


CONTROL_IP = "172.31.250.2"
PROBE = f"""
import json, socket
def dial(host):
    try:
        socket.create_connection((host, 8000), timeout=3).close()
        return "ok"
    except OSError as err:
        return type(err).__name__
print(json.dumps({{"connect": dial("superlink"), "control-ip": dial("{CONTROL_IP}")}}))
"""
CLI_ATTEMPTS = {  # what a compromised client would try with only the CA certificate
    "register": "flwr supernode register /tmp/p/k.pub probe --format json",
    "unregister": "flwr supernode unregister 1 probe --format json",
    "run": "flwr run \"$(ls -d /flwr/apps/*/ | head -1)\" probe --format json",
}
PREPARE = (
    "mkdir -p /tmp/p && printf '[superlink]\\ndefault = \"probe\"\\n[superlink.probe]\\n"
    "address = \"superlink:8000\"\\nroot-certificates = \"/keys/ca.crt\"\\n' "
    "> /tmp/p/config.toml && python -c \"from cryptography.hazmat.primitives import "
    "serialization as s; from cryptography.hazmat.primitives.asymmetric import ec; "
    "k = ec.generate_private_key(ec.SECP384R1()).public_key(); open('/tmp/p/k.pub', 'wb')"
    ".write(k.public_bytes(s.Encoding.OpenSSH, s.PublicFormat.OpenSSH))\"")


def compose(work: Path, *args: str, timeout: float = 120,
            env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FEDINIT_WORK": str(work), "FEDINIT_RESULTS": str(work / "results"),
           **(env_extra or {})}
    return subprocess.run(["docker-compose", "--project-directory", str(REPO), "-p", PROJECT,
                           "-f", str(REPO / "docker-compose.yml"), *args],
                          capture_output=True, text=True, timeout=timeout, env=env, check=False)


def control_api_probes(work: Path) -> dict[str, Any]:
    """Dial the Control API and try the operator's commands from inside each container."""
    found: dict[str, Any] = {}
    containers = {"supernode-0": compose(work, "ps", "-q", "supernode-0").stdout.strip(),
                  "edge-2": f"{PROJECT}-edge-2"}
    for who, cid in containers.items():
        dial = sh("docker", "exec", cid, "python", "-c", PROBE)
        found[who] = json.loads(dial.stdout or "{}") if dial.returncode == 0 else \
            {"connect": dial.stderr[-300:], "control-ip": "?"}
        sh("docker", "exec", cid, "sh", "-c", PREPARE)
        for name, cmd in CLI_ATTEMPTS.items():
            res = sh("docker", "exec", "-e", "FLWR_HOME=/tmp/p", cid, "timeout", "60",
                     "sh", "-c", cmd, timeout=120)
            found[who][name] = {"rc": res.returncode, "out": (res.stdout + res.stderr)[-300:]}
    cli = compose(work, "--profile", "cli", "run", "--rm", "-T", "cli", "python", "-c", PROBE)
    found["cli"] = json.loads(cli.stdout.strip().splitlines()[-1]) if cli.returncode == 0 \
        else {"connect": cli.stderr[-300:]}
    return found


def fetch(url: str, wait: float = 90.0) -> bytes:
    """GET ``url``, retried while the server comes up."""
    deadline = time.monotonic() + wait
    while True:
        try:
            with urllib.request.urlopen(url, timeout=10) as res:  # noqa: S310 - our loopback
                return bytes(res.read())
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(2)


def dashboard_view(work: Path, run_name: str) -> dict[str, Any]:
    """The operator's page (profile ``dashboard``) started on the finished run's results:
    where it is published, what it shows, and what it can dial."""
    (port,) = free_ports(1)
    up = compose(work, "--profile", "dashboard", "up", "-d", "dashboard",
                 env_extra={"FEDINIT_DASHBOARD_PORT": str(port)})
    assert up.returncode == 0, up.stderr[-2000:]
    cid = compose(work, "--profile", "dashboard", "ps", "-q", "dashboard").stdout.strip()
    base = f"http://127.0.0.1:{port}"
    dial = sh("docker", "exec", cid, "python", "-c", PROBE)
    return {"published": sh("docker", "port", cid).stdout.split("\n")[0].strip(),
            "port": port, "index": fetch(f"{base}/").decode(),
            "page": fetch(f"{base}/{run_name}/").decode(),
            "status": json.loads(fetch(f"{base}/{run_name}/status.json")),
            "dials": json.loads(dial.stdout or "{}") if dial.returncode == 0 else dial.stderr}


def probe(image: str, code: str, mount: str = "") -> subprocess.CompletedProcess[str]:
    """`python -c code` in a fresh, named (so removable), network-less container."""
    vol = ["-v", mount] if mount else []
    return sh("docker", "run", "--rm", "--network", "none", "--name",
              f"{PROJECT}-probe-{time.monotonic_ns()}", *vol, image, "python", "-c", code)


@pytest.mark.slow
def test_images_build_offline_non_root_without_secrets(docker: DockerEngine) -> None:
    t0 = time.monotonic()
    build = sh("bash", str(REPO / "deploy" / "build_images.sh"), timeout=2400)
    wall = time.monotonic() - t0
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    sizes = {}
    for target in IMAGES:
        image = f"{PREFIX}-{target}:{TAG}"
        info = json.loads(sh("docker", "image", "inspect", image).stdout)[0]
        sizes[target] = round(info["Size"] / 1e6)
        assert info["Config"]["User"] == "49999:49999", target
        env = dict(e.split("=", 1) for e in info["Config"]["Env"])
        assert env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] == "1"
        # No key material and no wheels in the image: a fresh container has neither.
        found = probe(image, "import glob, flwr; print(flwr.__version__, [p for d in "
                      "('/app', '/etc', '/flwr', '/home', '/opt', '/root', '/srv', '/tmp', "
                      "'/venv') for pat in ('*.key', 'node_key*', 'ca.crt', '*.whl') "
                      "for p in glob.glob(f'{d}/**/{pat}', recursive=True)] + "
                      "glob.glob('/wheels'))")
        assert found.stdout.split() == ["1.39.0", "[]"], found.stdout + found.stderr
    torch = probe(f"{PREFIX}-client-cpu:{TAG}", "import torch; print(torch.__version__)")
    assert torch.stdout.strip() == "2.13.0+cpu", torch.stdout + torch.stderr
    print(f"\nbuild_images.sh: {wall:.0f}s; image sizes (MB): {sizes}")


@pytest.mark.slow
def test_compose_stack_with_tls_auth_and_an_edge_node(docker: DockerEngine,
                                                      tmp_path: Path) -> None:
    config = sh("docker-compose", "-f", str(REPO / "docker-compose.yml"), "config").stdout
    for net in ("fleet", "control"):
        assert re.search(net + r":\n(\s+\S.*\n)*?\s+internal: true", config), net
    check_published_ports(yaml.safe_load(config))  # the page's, on 127.0.0.1, and no other
    # The CPU images carry no torchvision (none exists for CPU torch 2.13 on PyPI): the
    # ClientApp and ServerApp modules, every model included, must do without it.
    imports = probe(f"{PREFIX}-serverapp:{TAG}", "import client_app.app, server_app.app",
                    mount=f"{REPO}:/app:ro")
    assert imports.returncode == 0, (
        "the app does not import in the CPU images (it must not need torchvision):\n"
        + imports.stderr[-1500:])

    work = tmp_path / "compose"
    t0 = time.monotonic()
    run = sh("bash", str(REPO / "deploy" / "compose_run.sh"), "--project", PROJECT,
             "--work-dir", str(work), "--edge-node", "2", "--keep", "num-server-rounds=3",
             "fraction-train=1.0", "train-limit=3000", timeout=1200)
    wall = time.monotonic() - t0
    out = run.stdout + run.stderr
    view: dict[str, Any] = {}
    try:
        probes = control_api_probes(work)
        if run.returncode == 0:
            view = dashboard_view(work, run_dir(work / "results").name)
    finally:
        sh("docker", "rm", "-f", f"{PROJECT}-edge-2")
        compose(work, "--profile", "cli", "--profile", "dashboard", "down", "-v",
                "--remove-orphans")
    assert run.returncode == 0, out[-5000:]
    # The operator's page, in compose: published on the host's loopback only, it shows the
    # finished run and its three nodes, and it cannot dial the SuperLink (Fleet or Control).
    assert view["published"] == f"8050/tcp -> 127.0.0.1:{view['port']}", view["published"]
    assert run_dir(work / "results").name in view["index"]
    status = view["status"]
    assert status["run"]["state"] == "done" and status["run"]["round"] == 3, status["run"]
    assert len(status["fleet"]["nodes"]) == 3, status["fleet"]
    assert "connected" in view["page"] and status["run"]["name"] in view["page"]
    assert view["dials"]["connect"] != "ok" and view["dials"]["control-ip"] != "ok", view
    print(f"\nControl API probes: {probes}")
    # The operator's CLI reaches the Control API; a SuperNode (which runs the ClientApp) or
    # the edge node cannot: registering a key, unregistering a node, submitting a run fail.
    assert probes["cli"]["connect"] == "ok", probes
    for who in ("supernode-0", "edge-2"):
        p = probes[who]
        assert p["connect"] != "ok" and p["control-ip"] != "ok", probes
        for cmd in ("register", "unregister", "run"):
            # flwr --format json exits 0 and says "success": false
            assert '"success": false' in p[cmd]["out"] and "unavailable" in p[cmd]["out"], \
                (who, cmd, p)
    assert "status finished:completed" in out
    results = run_dir(work / "results")
    assert f"results in {results}" in out
    rows = rounds(results)
    assert [r["round"] for r in rows] == [1, 2, 3]
    assert all(r["num-replies"] == 3 for r in rows)
    best = max(r["test-acc"] for r in rows)
    assert best > 0.3, rows  # chance is 0.1
    for name in ("summary.json", "accuracy.png", "model.pt"):
        assert (results / name).stat().st_size > 0

    mem = re.search(r"edge peak memory: working set (\d+) MiB, cgroup high-water (\d+) MiB"
                    r".*OOM-killed: (\w+)", out)
    per_round = re.search(r"edge seconds per round: ([\d.]+)", out)
    assert mem and per_round, out[-3000:]
    working_set, high_water, oom = int(mem[1]), int(mem[2]), mem[3]
    assert oom == "false" and 0 < working_set < 1024
    edge_log = (work / "edge-2.log").read_text()
    assert edge_log.count("Receiving: train message") == 3, edge_log[-3000:]  # it took part
    print(f"\ncompose: {wall:.0f}s for compose_run.sh; best acc {best:.3f}; round seconds "
          f"{[round(r['round-seconds'], 1) for r in rows]}; edge node (--cpus 1 --memory 1g): "
          f"peak working set {working_set} MiB (cgroup high-water incl. page cache "
          f"{high_water} MiB), {float(per_round[1]):.1f} s/round")

    # Torn down: no container, volume or network of the project is left.
    for kind in ("ps -a", "volume ls", "network ls"):
        left = sh("docker", *kind.split(), "-q", "--filter",
                  f"label=com.docker.compose.project={PROJECT}").stdout.strip()
        assert left == "", f"docker {kind}: {left}"
    assert sh("docker", "ps", "-aq", "--filter", f"name={PROJECT}-edge").stdout.strip() == ""


SEES = """
import json, os
def files(root):
    paths = (os.path.join(d, f) for d, _, names in os.walk(root) for f in names)
    return sorted(f"{os.path.relpath(p, root)}:{os.path.getsize(p)}" for p in paths)
try:
    open("/data/written-by-node", "w").close()
    write = "ok"
except OSError as err:
    write = type(err).__name__ + ": " + str(err.strerror)
print(json.dumps({"data": files("/data") if os.path.isdir("/data") else None,
                  "shared": files("/usr/share/datasets/fashion-mnist"), "write": write,
                  "exists": {p: os.path.exists(p) for p in %r},
                  "roots": {f.split()[4]: f.split()[3] for f in open("/proc/self/mountinfo")}}))
"""


def host_files(root: Path) -> list[str]:
    return sorted(f"{p.relative_to(root)}:{p.stat().st_size}" for p in root.rglob("*")
                  if p.is_file())


@pytest.mark.slow
def test_compose_stack_with_device_data(docker: DockerEngine, tmp_path: Path) -> None:
    """compose_run.sh --device-data on the built images: node i trains on DIR/<i>/ only."""
    fmnist = load_dataset("fashion-mnist", str(default_data_dir("fashion-mnist")))
    made = skewed_fmnist_folders(tmp_path / "made", fmnist.train_x, fmnist.train_y, 3,
                                 per_node=300, seed=1)
    data = tmp_path / "device-data"
    data.mkdir()
    folders = [folder.rename(data / str(i)) for i, folder in enumerate(made)]
    mixes = [sorted(p.name for p in folder.iterdir()) for folder in folders]

    work = tmp_path / "compose"
    t0 = time.monotonic()
    run = sh("bash", str(REPO / "deploy" / "compose_run.sh"), "--project", PROJECT,
             "--work-dir", str(work), "--device-data", str(data), "--keep",
             f"device-classes={','.join(FMNIST_CLASSES)}", "device-mean=0.2860",
             "device-std=0.3530", "max-examples-per-client=1000", "num-server-rounds=2",
             "fraction-train=1.0", "local-epochs=1", timeout=600)
    wall = time.monotonic() - t0
    out = run.stdout + run.stderr
    seen: dict[str, Any] = {}
    try:
        others = [str(data), str(folders[0]), str(folders[2])]  # host paths
        for service in ("supernode-1", "superexec-serverapp"):
            cid = compose(work, "ps", "-q", service).stdout.strip()
            res = sh("docker", "exec", cid, "python", "-c", SEES % others)
            seen[service] = json.loads(res.stdout) if res.returncode == 0 else res.stderr[-500:]
    finally:
        compose(work, "--profile", "cli", "down", "-v", "--remove-orphans")
    assert run.returncode == 0, out[-5000:]
    assert "status finished:completed" in out

    results = run_dir(work / "results")
    config = json.loads((results / "config.json").read_text())
    assert config["dataset"] == "device" and config["device-mean"] == "0.2860", config
    summary = json.loads((results / "summary.json").read_text())
    assert summary["eval-source"] == "federated", summary
    rows = rounds(results)
    assert [r["round"] for r in rows] == [1, 2]
    for row in rows:
        assert row["clients-trained"] == [0, 1, 2] and row["num-replies"] == 3, row
        assert row["fed-eval-clients"] == 3 and row["test-acc"] is not None, row

    # Node 1 sees its own folder, read-only, and nothing of the others' or the shared set.
    node = seen["supernode-1"]
    assert isinstance(node, dict), node
    assert node["data"] == host_files(folders[1]) != host_files(folders[0]), node["data"][:5]
    assert node["data"] != host_files(folders[2])
    assert node["write"].startswith("OSError: Read-only file system"), node["write"]
    assert not any(node["exists"].values()), node["exists"]
    assert node["shared"] == [], node["shared"][:5]
    data_roots = [root for root in node["roots"].values() if data.name in root]
    assert node["roots"]["/data"].endswith(f"{data.name}/1") and len(data_roots) == 1, \
        node["roots"]
    # The server holds neither the devices' data nor the shared set.
    server = seen["superexec-serverapp"]
    assert isinstance(server, dict), server
    assert server["data"] is None and server["shared"] == [], server
    assert not any(server["exists"].values()), server["exists"]
    print(f"\ncompose with device data: {wall:.0f}s for compose_run.sh; federated accuracy "
          f"{[round(r['test-acc'], 3) for r in rows]}; images per node "
          f"{[len(host_files(f)) for f in folders]}; class folders per node {mixes}; "
          f"round seconds {[round(r['round-seconds'], 1) for r in rows]}")
