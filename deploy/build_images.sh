#!/usr/bin/env bash
# Build the deployment images offline: no registry, `docker build --network none`.
#
#   deploy/build_images.sh                      superlink, client-cpu, serverapp
#   deploy/build_images.sh client-cpu           only the named targets
#   deploy/build_images.sh --cuda client-cuda   also downloads the CUDA wheels (~3 GB)
#   deploy/build_images.sh --arch arm64         client-cpu for arm64 (default target), built
#                                               under qemu emulation (deploy/qemu_binfmt.sh)
#
# 1. Base image $BASE_IMAGE (default local/debian-py:bookworm, arm64: ...:bookworm-arm64): if
#    missing, debootstrap a Debian bookworm minbase with python3 + python3-venv from the
#    host's apt mirror and `docker import` it (needs root and debootstrap). arm64: debootstrap
#    --foreign, then the second stage in a chroot under qemu-aarch64.
# 2. Wheels, downloaded on the host into deploy/.build/wheels/{common,server,pillow,cpu,cuda}
#    (arm64: deploy/.build/wheels-arm64/{common,pillow,cpu}, `pip download --platform
#    manylinux_2_28_aarch64`)
#    with the host's pip (its index settings apply). A set is fetched once; a stamp records it.
# 3. `docker build --network none --target T -f deploy/Dockerfile deploy/.build/wheels`,
#    tagged $IMAGE_PREFIX-T:$IMAGE_TAG (default local/fedinit-T:flwr1.39.0, arm64:
#    ...:flwr1.39.0-arm64); docker's layer cache makes a repeated build a few seconds, and
#    an image whose inputs' hash (its label org.fedinit.inputs) is unchanged is not rebuilt.
#
# Environment: BASE_IMAGE, IMAGE_PREFIX, IMAGE_TAG, DEBIAN_MIRROR (default: the host's apt
# source for bookworm), PYTHON (host python3.11 for pip download), TORCH_CPU_WHEEL (a file or
# specs; default the local torch-2.13.0+cpu wheel in /opt/wheels, else torch==2.13.0; arm64:
# torch==2.9.1), TORCH_SPEC (what the cpu stage installs), CUDA_TORCH_SPEC, FORCE_BUILD=1
# (build even when the inputs are unchanged).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
build="$here/.build"

cuda=0
arch=amd64
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --cuda) cuda=1 ;;
    --arch) arch="${2:-}"; shift ;;
    --arch=*) arch="${1#--arch=}" ;;
    -h|--help) sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    superlink|client-cpu|serverapp|client-cuda) targets+=("$1") ;;
    *) echo "build_images: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
case "$arch" in
  amd64|x86_64) arch=amd64 ;;
  arm64|aarch64) arch=arm64 ;;
  *) echo "build_images: --arch takes amd64 or arm64" >&2; exit 2 ;;
esac

PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}
IMAGE_PREFIX=${IMAGE_PREFIX:-local/fedinit}
if [ "$arch" = amd64 ]; then
  wheels="$build/wheels"
  BASE_IMAGE=${BASE_IMAGE:-local/debian-py:bookworm}
  IMAGE_TAG=${IMAGE_TAG:-flwr1.39.0}
  cpu_wheel_file=/opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl
  if [ -z "${TORCH_CPU_WHEEL:-}" ]; then
    if [ -f "$cpu_wheel_file" ]; then TORCH_CPU_WHEEL=$cpu_wheel_file; else TORCH_CPU_WHEEL="torch==2.13.0"; fi
  fi
  TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
  pip_platform=()
  platform=()
  [ ${#targets[@]} -gt 0 ] || targets=(superlink client-cpu serverapp)
else
  # PyPI's aarch64 torch 2.10+ is a CUDA build (several GB of nvidia wheels, useless on an
  # edge board); 2.9.1 is the newest aarch64 CPU build, and the app needs no torchvision.
  wheels="$build/wheels-arm64"
  BASE_IMAGE=${BASE_IMAGE:-local/debian-py:bookworm-arm64}
  IMAGE_TAG=${IMAGE_TAG:-flwr1.39.0-arm64}
  TORCH_CPU_WHEEL=${TORCH_CPU_WHEEL:-torch==2.9.1}
  TORCH_SPEC=${TORCH_SPEC:-torch==2.9.1}
  # pip 23 does not widen an explicit --platform to older glibc tags: list them (bookworm
  # has glibc 2.36; torch is manylinux_2_28, grpcio manylinux2014 = manylinux_2_17).
  pip_platform=(--python-version 3.11 --platform manylinux2014_aarch64)
  for v in $(seq 17 28); do pip_platform+=(--platform "manylinux_2_${v}_aarch64"); done
  platform=(--platform linux/arm64)
  [ ${#targets[@]} -gt 0 ] || targets=(client-cpu)
  for t in "${targets[@]}"; do
    [ "$t" != client-cuda ] || { echo "build_images: no client-cuda for arm64" >&2; exit 2; }
  done
fi
CUDA_TORCH_SPEC=${CUDA_TORCH_SPEC:-torch==2.14.1 torchvision==0.29.1}
for t in "${targets[@]}"; do
  if [ "$t" = client-cuda ] && [ "$cuda" = 0 ]; then
    echo "build_images: client-cuda needs --cuda (downloads ~3 GB of CUDA wheels)" >&2; exit 2
  fi
done

log() { echo "build_images: [$((SECONDS))s] $*"; }
docker info >/dev/null 2>&1 || { echo "build_images: no docker engine (start dockerd)" >&2; exit 1; }
# One build at a time per checkout: two at once (the tests' two Docker modules on two
# workers) would debootstrap the same base and download into the same wheel folders; the
# second waits here, then finds its images up to date.
mkdir -p "$build"
exec 9>"$build/.lock"
if command -v flock >/dev/null && ! flock -n 9; then
  log "another build holds $build/.lock: waiting"
  flock 9
fi

# ------------------------------------------------------------------ 1. base image
debian_mirror() {
  # The first bookworm "main" source of the host (deb822 .sources, then one-line lists).
  local uri
  uri=$(awk '/^URIs:/{u=$2} /^Suites:.*bookworm( |$)/{if(u!=""){print u; exit}}' \
          /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
  [ -n "$uri" ] || uri=$(awk '$1=="deb" && $3=="bookworm" {print $2; exit}' \
          /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null || true)
  echo "${uri:-http://deb.debian.org/debian}"
}

# debootstrap mounts proc and sys in the target while it works and unmounts them when it
# exits; never tar or delete a root filesystem through a mount that is left (a failed run).
remove_rootfs() {
  local m
  for m in $(awk -v r="$1/" 'index($2, r) == 1 {print $2}' /proc/mounts | sort -r); do
    umount "$m" 2>/dev/null || umount -l "$m"
  done
  if awk -v r="$1/" 'index($2, r) == 1 {found = 1} END {exit !found}' /proc/mounts; then
    echo "build_images: mounts left under $1; not removing it" >&2; exit 1
  fi
  rm -rf "$1"
}

mkdir -p "$build"
if [ "$arch" = arm64 ]; then
  # The arm64 RUN steps (and debootstrap's second stage) execute under qemu-aarch64.
  rc=0; "$here/qemu_binfmt.sh" || rc=$?
  [ "$rc" = 0 ] || { echo "build_images: arm64 needs qemu-aarch64 in binfmt_misc" >&2; exit "$rc"; }
fi
if ! docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
  [ "$(id -u)" = 0 ] || { echo "build_images: building $BASE_IMAGE needs root (debootstrap)" >&2; exit 1; }
  command -v debootstrap >/dev/null || { echo "build_images: apt-get install -y debootstrap" >&2; exit 1; }
  mirror=${DEBIAN_MIRROR:-$(debian_mirror)}
  rootfs="$build/rootfs-$arch"
  remove_rootfs "$rootfs"
  log "debootstrap bookworm minbase ($arch) from $mirror"
  dlog="$build/debootstrap-$arch.log"
  if [ "$arch" = amd64 ]; then
    debootstrap --variant=minbase --include=python3,python3-venv bookworm "$rootfs" "$mirror" \
      > "$dlog" 2>&1 || { tail -20 "$dlog" >&2; exit 1; }
  else
    # Foreign: unpack on the host, then configure inside the arm64 root under qemu.
    { debootstrap --arch arm64 --foreign --variant=minbase --include=python3,python3-venv \
        bookworm "$rootfs" "$mirror" && log "debootstrap second stage under qemu-aarch64" \
        && chroot "$rootfs" /debootstrap/debootstrap --second-stage; } > "$dlog" 2>&1 \
      || { tail -20 "$dlog" >&2; exit 1; }
  fi
  for m in $(awk -v r="$rootfs/" 'index($2, r) == 1 {print $2}' /proc/mounts | sort -r); do
    umount "$m"
  done
  # Nothing of the host's mirror or package caches goes into the image.
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  echo "# offline image: no package sources" > "$rootfs/etc/apt/sources.list"
  if [ "$arch" = amd64 ]; then
    tar -C "$rootfs" -c . | docker import -c 'ENV LANG=C.UTF-8' -c 'CMD ["python3"]' - "$BASE_IMAGE" >/dev/null
  else
    # docker import (20.10) would label it amd64 whatever --platform says: load it instead.
    tar -C "$rootfs" -c -f "$rootfs.tar" .
    "$PYTHON" "$here/load_rootfs.py" "$rootfs.tar" "$BASE_IMAGE" arm64 | docker load >/dev/null
    rm -f "$rootfs.tar"
  fi
  remove_rootfs "$rootfs"
  log "imported $BASE_IMAGE"
else
  log "base image $BASE_IMAGE present"
fi

# ------------------------------------------------------------------ 2. wheels
pip_get() {  # pip_get DIR ARGS...: pip download ARGS into DIR, binaries for the target arch
  local dir=$1; shift
  "$PYTHON" -m pip download --quiet --disable-pip-version-check --only-binary=:all: \
    "${pip_platform[@]}" --dest "$dir" "$@" 2>&1 | grep -v "is ignored" || true
}
fetch() {  # fetch SET SPEC...: pip download into wheels/SET unless its stamp matches SPEC
  local set="$1"; shift
  local dir="$wheels/$set" stamp="$wheels/$set.stamp"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$*" ]; then
    log "wheels/$set cached"
    return
  fi
  rm -rf "$dir"; mkdir -p "$dir"
  log "downloading wheels/$set: $*"
  if [ "$arch" = amd64 ]; then
    pip_get "$dir" "$@"
  else
    # pip evaluates environment markers for the host even with --platform: torch's
    # `platform_machine == "x86_64"` nvidia/triton wheels (~3 GB) would come along. So: the
    # named packages without dependencies, then their dependencies as aarch64 sees them.
    pip_get "$dir" --no-deps "$@"
    local deps
    mapfile -t deps < <("$PYTHON" - "$dir" <<'PY'
import sys, zipfile
from pathlib import Path
from pip._vendor.packaging.markers import default_environment
from pip._vendor.packaging.requirements import Requirement
env = {**default_environment(), "platform_machine": "aarch64", "extra": ""}
for wheel in Path(sys.argv[1]).glob("*.whl"):
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        for line in z.read(meta).decode().splitlines():
            if line.startswith("Requires-Dist:"):
                req = Requirement(line.split(":", 1)[1].strip())
                if req.marker is None or req.marker.evaluate(env):
                    extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
                    print(f"{req.name}{extras}{req.specifier}")
PY
    )
    [ ${#deps[@]} = 0 ] || pip_get "$dir" "${deps[@]}"
  fi
  ls "$dir"/*.whl >/dev/null 2>&1 || { echo "build_images: no wheels for $set" >&2; exit 1; }
  echo "$*" > "$stamp"
}
mkdir -p "$wheels"
fetch common "flwr==1.39.0" "numpy==2.4.6" "pyyaml==6.0.4"
[ "$arch" = arm64 ] && [[ ! " ${targets[*]} " =~ " serverapp " ]] \
  || fetch server "matplotlib==3.11.2" "numpy==2.4.6" "dp-accounting==0.6.0" "tensorboard==2.21.0"
fetch pillow "pillow==13.0.0"
read -r -a cpu_specs <<< "$TORCH_CPU_WHEEL"  # a file, or specs such as "torch==2.9.1 torchvision==0.24.1"
fetch cpu "${cpu_specs[@]}"
read -r -a cuda_specs <<< "$CUDA_TORCH_SPEC"  # a space-separated list of requirement specs
[ "$cuda" = 0 ] || fetch cuda "${cuda_specs[@]}"

# The node runtime (warm ClientApp executor + launcher, and flower_compat: the guarded patches
# it installs) goes into the client images; the apps themselves arrive as FABs.
rm -rf "${wheels:?}/fedinit" "${wheels:?}/node" "${wheels:?}/flower_compat"
for pkg in node flower_compat; do
  mkdir -p "$wheels/fedinit/$pkg"
  cp "$(dirname "$here")/fedinit/$pkg"/*.py "$wheels/fedinit/$pkg/"
done

# ------------------------------------------------------------------ 3. images
# An image whose inputs are unchanged is not rebuilt: even with every layer cached, the
# legacy builder sends the whole context (the torch wheel alone is ~190 MB; client-cuda's
# ~3 GB) and re-checks each step. The inputs' hash is the image's label INPUTS_LABEL: the
# target, platform, base image id and build args, the Dockerfile, the context's file names
# and sizes (wheels are immutable by name; the stamps record their specs) and the content of
# the copied sources (fedinit/node/, fedinit/flower_compat/). FORCE_BUILD=1 builds anyway.
INPUTS_LABEL=org.fedinit.inputs
inputs_hash() {  # inputs_hash TARGET
  local skip=cuda
  [ "$1" != client-cuda ] || skip=none
  {
    echo "$1 $arch ${platform[*]} $(docker image inspect -f '{{.Id}}' "$BASE_IMAGE")"
    echo "$TORCH_SPEC | $CUDA_TORCH_SPEC"
    cat "$here/Dockerfile"
    (cd "$wheels" && find . -type f ! -name '*.stamp' ! -name .dockerignore \
       ! -path "./$skip/*" -printf '%P %s\n' | LC_ALL=C sort)
    (cd "$wheels" && find fedinit -type f -print0 | LC_ALL=C sort -z \
       | xargs -0 sha256sum)
  } | sha256sum | cut -d' ' -f1
}
for t in "${targets[@]}"; do
  image="$IMAGE_PREFIX-$t:$IMAGE_TAG"
  inputs=$(inputs_hash "$t")
  if [ "${FORCE_BUILD:-0}" != 1 ] && [ "$(docker image inspect \
       -f "{{index .Config.Labels \"$INPUTS_LABEL\"}}" "$image" 2>/dev/null)" = "$inputs" ]; then
    log "$image up to date (inputs ${inputs:0:12} unchanged): not rebuilt"
    continue
  fi
  # The legacy builder sends the whole context: leave the big CUDA set out unless needed.
  if [ "$t" = client-cuda ]; then echo "*.stamp" > "$wheels/.dockerignore"
  else printf '*.stamp\ncuda\n' > "$wheels/.dockerignore"; fi
  log "docker build --target $t"
  docker build "${platform[@]}" --network none --target "$t" -f "$here/Dockerfile" \
    --build-arg BASE_IMAGE="$BASE_IMAGE" --build-arg TORCH_SPEC="$TORCH_SPEC" \
    --build-arg CUDA_TORCH_SPEC="$CUDA_TORCH_SPEC" --label "$INPUTS_LABEL=$inputs" \
    -t "$image" "$wheels" > "$build/build-$t-$arch.log" 2>&1 \
    || { tail -30 "$build/build-$t-$arch.log" >&2; exit 1; }
  log "$IMAGE_PREFIX-$t:$IMAGE_TAG $(docker image inspect -f '{{.Size}}' "$IMAGE_PREFIX-$t:$IMAGE_TAG" \
        | awk '{printf "%.0f MB", $1/1e6}')"
done
