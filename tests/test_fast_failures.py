"""Every bad config value, unknown key and missing data set fails in well under a second,
with one line, before torch, Ray or any SuperNode starts."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest

from fedinit.cli.flower_env import REPO

SIMULATE = [sys.executable, "-m", "fedinit.cli.simulate"]
BOUND_S = 3.0
"""CPU seconds (user + system) the refusing process may take; measured about 0.2 s each.
CPU, not wall time: under a load of 10 on 2 cores the same refusals took 3-5 s of wall
time (12 failures in one fast-suite run), while their CPU time barely moves."""

BAD = [
    ("bta=0.1", "unknown key 'bta' (did you mean 'beta'?)"),
    ("num-server-round=5", "did you mean 'num-server-rounds'?"),
    ("beta=1.5", "beta=1.5 is not allowed"),
    ("method=fedavgg", "method='fedavgg' is not allowed (did you mean 'fedavg'?)"),
    ("dataset=cifar", "(did you mean 'cifar10'?)"),
    ("model=resnet18", "(did you mean 'resnet18-gn'?)"),
    ("partition=diriclet", "(did you mean 'dirichlet'?)"),
    ("num-server-rounds=1.5", "num-server-rounds=1.5 has type float"),
    ("lr=nan", "lr=nan is not allowed"),
    ("model=vgg11", "does not fit dataset='fashion-mnist'"),
    ("train-limit=5", "train-limit=5 is not allowed"),
]


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_simulate(*args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """The finished process and the CPU seconds it (and its children) used: a test runs its
    subprocesses one at a time, so the difference of this process's children's CPU is its."""
    before = children_cpu()
    proc = subprocess.run([*SIMULATE, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=60, check=False)
    return proc, children_cpu() - before


@pytest.mark.parametrize(("arg", "message"), BAD)
def test_bad_config_fails_fast_with_one_line(arg: str, message: str, tmp_path: Path) -> None:
    proc, seconds = run_simulate(arg, f"output-dir={tmp_path}")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert seconds < BOUND_S, f"{arg}: {seconds:.2f}s"
    assert "flwr run" not in proc.stdout  # nothing was started


@pytest.mark.parametrize(("dataset", "hint"), [
    ("fashion-mnist", "apt-get install"),
    ("cifar10", "torchvision.datasets.CIFAR10"),
    ("cifar100", "torchvision.datasets.CIFAR100"),
])
def test_missing_data_set_fails_fast(dataset: str, hint: str, tmp_path: Path) -> None:
    proc, seconds = run_simulate(f"dataset={dataset}", f"data-dir={tmp_path / 'none'}",
                                 f"output-dir={tmp_path}")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"{dataset} not found" in proc.stderr and hint in proc.stderr
    assert seconds < BOUND_S, f"{dataset}: {seconds:.2f}s"


def test_config_check_imports_neither_torch_nor_flower() -> None:
    # The method modules (the registry the config is built from) need numpy (60 ms), not
    # torch (a client hook imports it when it runs) and not Flower (the server's strategy
    # shell and the robust statistics do).
    code = ("import sys; from fedinit.config import RunConfig; import fedinit.cli.simulate; "
            "RunConfig.parse({}); "
            "print(sorted(({m.split('.')[0] for m in sys.modules} & {'torch', 'flwr', 'ray'}) "
            "| ({m for m in sys.modules} "
            "& {'fedinit.methods.robust', 'client_app', 'server_app'})))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == "[]"
