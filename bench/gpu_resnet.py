"""ResNet-18-GN on CIFAR-10 at the paper's per-round work: seconds per round and samples/s.

    .venv/bin/python -m bench.gpu_resnet --data-dir data/cifar10               # GPU host
    .venv/bin/python -m bench.gpu_resnet --data-dir ../shared/data/cifar10-jpg.tar.gz \\
        --rounds 1 --clients 2 --samples 100 --epochs 1                        # CPU, quick
    .venv/bin/python -m bench.gpu_resnet --data-dir DIR --flower --num-gpus-per-client 0.25

One round = --clients clients x --epochs local epochs x --samples images each (default 10 x 5
x 500, batch 50, lr 0.1, weight decay 1e-3, clipping 10, as in the paper), FedInit's relaxed
start and model averaging, then the central evaluation on the test set (--eval-limit images).
The default is the plain loop on one device (CUDA when present): the compute floor. --flower
runs the same work through fedinit/cli/simulate.py (100 clients, 10% per round, iid 500 images
each) and reads the round times the ServerApp recorded, to show what the framework adds.
Numbers are printed for the device it ran on; nothing is extrapolated to other devices.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from bench.scale_clients import stop_superlinks
from client_app.trainer import local_sgd
from fedinit.cli.flower_env import flower_env
from fedinit.methods.ri import relaxed_start, weighted_mean
from fedinit.task.datasets import load_dataset, to_tensor
from fedinit.task.device import describe, device
from fedinit.task.evaluation import evaluate
from fedinit.task.models import build_model, get_weights, set_weights

HTTP_PORT, CONTROL_PORT = "39791", "39793"


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def plain(args: argparse.Namespace) -> None:
    """The round's work in one process on one device, timed per phase."""
    dev = device()
    torch.backends.cudnn.benchmark = True
    data = load_dataset(args.dataset, args.data_dir)
    rng = np.random.default_rng(0)
    model = build_model(args.model, data.num_classes, data.in_channels, 0,
                        data.image_size).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    w = get_weights(model)
    w_prev: dict[int, list[np.ndarray]] = {}
    n_eval = min(args.eval_limit, len(data.test_y))
    test_idx = np.sort(rng.choice(len(data.test_y), size=n_eval, replace=False))  # all classes
    x_test = to_tensor(data.test_x[test_idx], data.mean, data.std).to(dev)
    y_test = torch.from_numpy(data.test_y[test_idx].copy()).long().to(dev)
    clients = []
    for _ in range(args.clients):
        idx = rng.choice(len(data.train_y), size=args.samples, replace=False)
        clients.append((to_tensor(data.train_x[idx], data.mean, data.std).to(dev),
                        torch.from_numpy(data.train_y[idx].copy()).long().to(dev)))
    print(f"{args.model} ({n_params / 1e6:.2f} M parameters) on {describe(dev)}; torch "
          f"{torch.__version__}; {args.clients} clients x {args.epochs} epochs x "
          f"{args.samples} images, batch {args.batch_size}; eval on {n_eval} images", flush=True)
    rows = []
    for rnd in range(1, args.rounds + 1):
        t0 = time.perf_counter()
        finals = []
        for cid, (x, y) in enumerate(clients):
            set_weights(model, relaxed_start(w, w_prev.get(cid, w), 0.1))
            local_sgd(model, x, y, epochs=args.epochs, batch_size=args.batch_size, lr=0.1,
                      weight_decay=1e-3, clip_norm=10.0,
                      generator=torch.Generator().manual_seed(rnd * 1000 + cid))
            w_prev[cid] = get_weights(model)
            finals.append(w_prev[cid])
        w = weighted_mean(finals, [float(args.samples)] * len(finals))
        sync(dev)
        t1 = time.perf_counter()
        set_weights(model, w)
        _, acc = evaluate(model, x_test, y_test)
        sync(dev)
        t2 = time.perf_counter()
        trained = args.clients * args.epochs * args.samples
        rows.append({"round": rnd, "train-s": t1 - t0, "eval-s": t2 - t1, "round-s": t2 - t0,
                     "train-samples/s": trained / (t1 - t0), "eval-samples/s": n_eval / (t2 - t1),
                     "test-acc": acc})
        r = rows[-1]
        print(f"round {rnd}: {r['round-s']:.2f} s (train {r['train-s']:.2f} s = "
              f"{r['train-samples/s']:.0f} samples/s, eval {r['eval-s']:.2f} s = "
              f"{r['eval-samples/s']:.0f} images/s), acc {100 * acc:.2f}%", flush=True)
    steady = rows[1:] or rows  # round 1 includes cuDNN autotuning and allocator warm-up
    mean_round = float(np.mean([r["round-s"] for r in steady]))
    print(f"steady state ({len(steady)} rounds): {mean_round:.2f} s/round, "
          f"{np.mean([r['train-samples/s'] for r in steady]):.0f} train samples/s; "
          f"500 rounds would take {500 * mean_round / 3600:.2f} h on this device")
    if args.json:
        args.json.write_text(json.dumps({"device": describe(dev), "rows": rows}, indent=2))


def flower(args: argparse.Namespace) -> None:
    """The same per-round work as a `flwr run` simulation; round times from rounds.jsonl."""
    out = Path(tempfile.mkdtemp(prefix="bench-gpu-resnet-"))
    n = args.clients * 10
    overrides = {"dataset": args.dataset, "data-dir": str(Path(args.data_dir).resolve()),
                 "model": args.model, "num-clients": n, "fraction-train": 0.1,
                 "partition": "iid", "train-limit": n * args.samples,
                 "local-epochs": args.epochs, "batch-size": args.batch_size, "lr": 0.1,
                 "weight-decay": 0.001, "clip-norm": 10.0, "num-server-rounds": args.rounds,
                 "beta": 0.1, "output-dir": str(out)}
    env = flower_env(out / "flwr-home", FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=HTTP_PORT,
                     FLWR_LOCAL_CONTROL_API_PORT=CONTROL_PORT)
    cmd = [sys.executable, "-m", "fedinit.cli.simulate",
           f"--num-gpus-per-client={args.num_gpus_per_client:g}",
           f"--num-cpus-per-client={args.num_cpus_per_client:g}",
           *(f"{k}={v}" for k, v in overrides.items())]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    finally:
        stop_superlinks(CONTROL_PORT)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        sys.exit(f"simulation failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}")
    (run_dir,) = [p for p in out.iterdir() if p.is_dir() and p.name != "flwr-home"]
    rows = [json.loads(x) for x in (run_dir / "rounds.jsonl").read_text().splitlines()]
    secs = [r["round-seconds"] for r in rows]
    steady = secs[1:] or secs
    trained = args.clients * args.epochs * args.samples
    print(f"flower simulation, {args.model}, {args.clients} of {n} clients per round, "
          f"{args.num_gpus_per_client:g} GPU per client: rounds {[f'{s:.1f}' for s in secs]} s;"
          f" steady {np.mean(steady):.2f} s/round = {trained / np.mean(steady):.0f} train "
          f"samples/s (eval included); whole command {wall:.0f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", required=True, help="CIFAR-10 (torchvision folder or tarball)")
    ap.add_argument("--dataset", default="cifar10", choices=["cifar10", "cifar100"])
    ap.add_argument("--model", default="resnet18-gn", choices=["resnet18-gn", "vgg11"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", type=int, default=10, help="clients trained per round")
    ap.add_argument("--samples", type=int, default=500, help="images per client")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=50)
    ap.add_argument("--eval-limit", type=int, default=10_000, help="test images evaluated")
    ap.add_argument("--flower", action="store_true", help="run through a flwr simulation")
    ap.add_argument("--num-gpus-per-client", type=float, default=0.0)
    ap.add_argument("--num-cpus-per-client", type=float, default=1.0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.flower:
        flower(args)
    else:
        plain(args)


if __name__ == "__main__":
    main()
