#!/usr/bin/env bash
# Build the deployment images offline: no registry, `docker build --network none`.
#
#   deploy/build_images.sh                      superlink, client-cpu, serverapp
#   deploy/build_images.sh client-cpu           only the named targets
#   deploy/build_images.sh --cuda client-cuda   also downloads the CUDA wheels (~4 GB)
#
# 1. Base image $BASE_IMAGE (default local/debian-py:bookworm): if missing, debootstrap a
#    Debian bookworm minbase with python3 + python3-venv from the host's apt mirror and
#    `docker import` it (needs root and debootstrap).
# 2. Wheels, downloaded on the host into deploy/.build/wheels/{common,server,cpu,cuda} with
#    the host's pip (its index settings apply). A set is fetched once; a stamp records its spec.
# 3. `docker build --network none --target T -f deploy/Dockerfile deploy/.build/wheels`,
#    tagged $IMAGE_PREFIX-T:$IMAGE_TAG (default local/fedinit-T:flwr1.39.0); docker's layer
#    cache makes a repeated build a few seconds.
#
# Environment: BASE_IMAGE, IMAGE_PREFIX, IMAGE_TAG, DEBIAN_MIRROR (default: the host's apt
# source for bookworm), PYTHON (host python3.11 for pip download), TORCH_CPU_WHEEL (a file or
# specs; default the local torch-2.13.0+cpu wheel in /opt/wheels, else torch==2.13.0),
# TORCH_SPEC (what the cpu stage installs), CUDA_TORCH_SPEC.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
build="$here/.build"
wheels="$build/wheels"
BASE_IMAGE=${BASE_IMAGE:-local/debian-py:bookworm}
IMAGE_PREFIX=${IMAGE_PREFIX:-local/fedinit}
IMAGE_TAG=${IMAGE_TAG:-flwr1.39.0}
PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}
cpu_wheel_file=/opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl
if [ -z "${TORCH_CPU_WHEEL:-}" ]; then
  if [ -f "$cpu_wheel_file" ]; then TORCH_CPU_WHEEL=$cpu_wheel_file; else TORCH_CPU_WHEEL="torch==2.13.0"; fi
fi
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
CUDA_TORCH_SPEC=${CUDA_TORCH_SPEC:-torch==2.14.1 torchvision==0.29.1}

cuda=0
targets=()
for arg in "$@"; do
  case "$arg" in
    --cuda) cuda=1 ;;
    -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    superlink|client-cpu|serverapp|client-cuda) targets+=("$arg") ;;
    *) echo "build_images: unknown argument $arg" >&2; exit 2 ;;
  esac
done
[ ${#targets[@]} -gt 0 ] || targets=(superlink client-cpu serverapp)
for t in "${targets[@]}"; do
  if [ "$t" = client-cuda ] && [ "$cuda" = 0 ]; then
    echo "build_images: client-cuda needs --cuda (downloads ~4 GB of CUDA wheels)" >&2; exit 2
  fi
done

log() { echo "build_images: [$((SECONDS))s] $*"; }
docker info >/dev/null 2>&1 || { echo "build_images: no docker engine (start dockerd)" >&2; exit 1; }

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

mkdir -p "$build"
if ! docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
  [ "$(id -u)" = 0 ] || { echo "build_images: building $BASE_IMAGE needs root (debootstrap)" >&2; exit 1; }
  command -v debootstrap >/dev/null || { echo "build_images: apt-get install -y debootstrap" >&2; exit 1; }
  mirror=${DEBIAN_MIRROR:-$(debian_mirror)}
  rootfs="$build/rootfs"
  rm -rf "$rootfs"
  log "debootstrap bookworm minbase from $mirror"
  debootstrap --variant=minbase --include=python3,python3-venv bookworm "$rootfs" "$mirror" \
    > "$build/debootstrap.log" 2>&1 || { tail -20 "$build/debootstrap.log" >&2; exit 1; }
  # Nothing of the host's mirror or package caches goes into the image.
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  echo "# offline image: no package sources" > "$rootfs/etc/apt/sources.list"
  tar -C "$rootfs" -c . | docker import -c 'ENV LANG=C.UTF-8' -c 'CMD ["python3"]' - "$BASE_IMAGE" >/dev/null
  rm -rf "$rootfs"
  log "imported $BASE_IMAGE"
else
  log "base image $BASE_IMAGE present"
fi

# ------------------------------------------------------------------ 2. wheels
fetch() {  # fetch SET SPEC...: pip download into wheels/SET unless its stamp matches SPEC
  local set="$1"; shift
  local dir="$wheels/$set" stamp="$wheels/$set.stamp"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$*" ]; then
    log "wheels/$set cached"
    return
  fi
  rm -rf "$dir"; mkdir -p "$dir"
  log "downloading wheels/$set: $*"
  "$PYTHON" -m pip download --quiet --disable-pip-version-check --only-binary=:all: \
    --dest "$dir" "$@" 2>&1 | grep -v "is ignored" || true
  ls "$dir"/*.whl >/dev/null 2>&1 || { echo "build_images: no wheels for $set" >&2; exit 1; }
  echo "$*" > "$stamp"
}
mkdir -p "$wheels"
fetch common "flwr==1.39.0" "numpy==2.4.6" "pyyaml==6.0.4"
fetch server "matplotlib==3.11.2" "numpy==2.4.6"
read -r -a cpu_specs <<< "$TORCH_CPU_WHEEL"  # a file, or specs such as "torch==2.9.1 torchvision==0.24.1"
fetch cpu "${cpu_specs[@]}"
read -r -a cuda_specs <<< "$CUDA_TORCH_SPEC"  # a space-separated list of requirement specs
[ "$cuda" = 0 ] || fetch cuda "${cuda_specs[@]}"

# The node runtime (warm ClientApp executor + launcher) goes into the client images; the
# apps themselves arrive as FABs.
rm -rf "$wheels/node"
mkdir -p "$wheels/node"
cp "$(dirname "$here")"/node/*.py "$wheels/node/"

# ------------------------------------------------------------------ 3. images
for t in "${targets[@]}"; do
  # The legacy builder sends the whole context: leave the big CUDA set out unless needed.
  if [ "$t" = client-cuda ]; then echo "*.stamp" > "$wheels/.dockerignore"
  else printf '*.stamp\ncuda\n' > "$wheels/.dockerignore"; fi
  log "docker build --target $t"
  docker build --network none --target "$t" -f "$here/Dockerfile" \
    --build-arg BASE_IMAGE="$BASE_IMAGE" --build-arg TORCH_SPEC="$TORCH_SPEC" \
    --build-arg CUDA_TORCH_SPEC="$CUDA_TORCH_SPEC" \
    -t "$IMAGE_PREFIX-$t:$IMAGE_TAG" "$wheels" > "$build/build-$t.log" 2>&1 \
    || { tail -30 "$build/build-$t.log" >&2; exit 1; }
  log "$IMAGE_PREFIX-$t:$IMAGE_TAG $(docker image inspect -f '{{.Size}}' "$IMAGE_PREFIX-$t:$IMAGE_TAG" \
        | awk '{printf "%.0f MB", $1/1e6}')"
done
