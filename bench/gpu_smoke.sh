#!/usr/bin/env bash
# GPU smoke test, one command, a few minutes: a few rounds of ResNet-18-GN on the CIFAR-10
# copy on CUDA, printing the device name and the seconds per round (bench/gpu_resnet.py's
# plain loop: 10 clients x 5 local epochs x 500 images per round, as in the paper).
#
#   bench/gpu_smoke.sh                  in the host venv (.venv, CUDA torch 2.14.1)
#   bench/gpu_smoke.sh --image [IMG]    in the client-cuda image (default
#                                       local/fedinit-client-cuda:flwr1.39.0), `--gpus all`;
#                                       build it first: deploy/build_images.sh --cuda client-cuda
#   bench/gpu_smoke.sh ... -- ARGS      extra bench/gpu_resnet.py arguments (e.g. --rounds 5)
#
# Exits 1 with "no CUDA GPU" before any work where no GPU is visible (no nvidia-smi, no
# driver, or torch.cuda.is_available() false): it never reports a CPU number as a GPU one.
# Data: CIFAR10 (default ../shared/data/cifar10-jpg.tar.gz, relative to the repository
# root; a torchvision CIFAR-10 folder works too). GPU_SMOKE_ALLOW_CPU=1 runs the same
# plumbing on the CPU (for checking the script itself; the output says cpu).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
image=""
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --image)
      image="local/fedinit-client-cuda:flwr1.39.0"
      if [ $# -gt 1 ] && [[ "$2" != -* ]]; then image="$2"; shift; fi ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_smoke: unknown argument $1 (bench/gpu_resnet.py arguments go after --)" >&2
       exit 2 ;;
  esac
  shift
done
allow_cpu=${GPU_SMOKE_ALLOW_CPU:-0}
no_gpu() { echo "gpu_smoke: no CUDA GPU: $*" >&2; exit 1; }

# 1. A GPU must be visible before anything runs (the driver's view, then torch's below).
if [ "$allow_cpu" != 1 ]; then
  command -v nvidia-smi >/dev/null || no_gpu "nvidia-smi not found (no NVIDIA driver on this host)"
  gpus=$(nvidia-smi -L 2>&1) || no_gpu "nvidia-smi failed: $gpus"
  [ -n "$gpus" ] || no_gpu "nvidia-smi lists no GPU"
  echo "gpu_smoke: nvidia-smi: $gpus"
fi

# 2. The check and the benchmark, in the venv or in the image.
data=${CIFAR10:-../shared/data/cifar10-jpg.tar.gz}
[ -e "$data" ] || { echo "gpu_smoke: CIFAR-10 not found at $data (set CIFAR10=...)" >&2; exit 2; }
data=$(realpath "$data")
check='import sys, torch
ok = torch.cuda.is_available()
name = torch.cuda.get_device_name(0) if ok else "cpu (no CUDA device visible to torch)"
print(f"gpu_smoke: torch {torch.__version__} (CUDA {torch.version.cuda}), device: {name}", flush=True)
sys.exit(0 if ok else 3)'
args=(-m bench.gpu_resnet --data-dir "/data/$(basename "$data")" --model resnet18-gn --rounds 3 "${extra[@]}")
if [ -z "$image" ]; then
  py=${PYTHON:-$repo/.venv/bin/python}
  [ -x "$py" ] || py=$(command -v python3)
  run() { "$py" "$@"; }
  args[3]=$data
else
  docker image inspect "$image" >/dev/null 2>&1 \
    || { echo "gpu_smoke: image $image missing: deploy/build_images.sh --cuda client-cuda" >&2; exit 2; }
  gpu_opts=(--gpus all)
  [ "$allow_cpu" != 1 ] || gpu_opts=()
  run() {
    docker run --rm --network none "${gpu_opts[@]}" --shm-size 1g \
      -v "$repo":/app:ro -v "$data":"/data/$(basename "$data")":ro -e FEDINIT_CACHE_DIR=/tmp/cache \
      -w /app "$image" python "$@"
  }
fi
rc=0; run -c "$check" || rc=$?
if [ "$rc" = 3 ] && [ "$allow_cpu" != 1 ]; then
  no_gpu "torch.cuda.is_available() is false${image:+ in $image (NVIDIA container toolkit?)}"
fi
if [ "$rc" = 125 ] && [ -n "$image" ]; then
  no_gpu "docker could not start $image with --gpus all (NVIDIA container toolkit missing?)"
fi
[ "$rc" = 0 ] || [ "$rc" = 3 ] || { echo "gpu_smoke: torch check failed ($rc)" >&2; exit 1; }
t0=$SECONDS
run "${args[@]}"
echo "gpu_smoke: done in $((SECONDS - t0)) s (${image:-venv})"
