#!/usr/bin/env bash
# One experiment on the docker-compose deployment, start to finish:
#   certs -> images (built offline if missing) -> SuperLink + ServerApp executor -> register
#   node keys -> SuperNodes + ClientApp executors -> flwr run --stream -> status check ->
#   results -> down (volumes removed) unless --keep.
#
#   deploy/compose_run.sh [options] [key=value ...]     run-config overrides
#     --keep            leave the stack up (stop: docker-compose -p PROJECT down -v)
#     --project NAME    compose project name (default fedinit)
#     --work-dir DIR    certs/, cli/, results/ (default deploy/.build/compose)
#     --app DIR         the Flower App to run (default: this repo)
#     --gpu             add docker-compose.gpu.yml (client-cuda executors, GPUs reserved)
#     --cuda-on-cpu     add docker-compose.gpu.yml without its GPU reservation: the client-cuda
#                       image on the CPU (a host without GPUs; the config is still validated)
#     --edge-node I     run partition I as an edge SuperNode instead (deploy/edge/run-docker.sh:
#                       one client-cpu container, --cpus 1 --memory 1g) and report its peak
#                       memory and seconds per round
#     --edge-image IMG  the edge node's image (default the stack's client-cpu)
#     --edge-platform P its platform, e.g. linux/arm64 (emulated: deploy/qemu_binfmt.sh)
#     --edge-memory M   its memory limit (default 1g)
#     --device-data DIR each node trains on data of its own (run config dataset=device): node
#                       i's is DIR/<i>/ (an image folder, <class>/<file>) or DIR/<i>.npz,
#                       mounted read-only in its container only (docker-compose.device-data.yml);
#                       nobody gets the shared data set. Give the schema as key=value
#                       (device-classes, device-mean, ..., max-examples-per-client).
#
# Exit status 0 only when `flwr ls` reports the run finished:completed. Prints the results
# directory on the host. Needs docker + docker-compose (1.29) and root or the docker group.
# A value for a key whose default (the app's pyproject.toml) is a string stays a string
# (device-mean=0.2860 is "0.2860"); other values are TOML scalars as given.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
project=fedinit
work="$here/.build/compose"
keep=0
gpu=0
edge=""
edge_image=""
edge_platform=""
edge_memory=1g
device_data=""
app="$repo"
overrides=()
while [ $# -gt 0 ]; do
  case "$1" in
    --keep) keep=1; shift ;;
    --project) project="$2"; shift 2 ;;
    --work-dir) work="$2"; shift 2 ;;
    --app) app="$2"; shift 2 ;;
    --gpu) gpu=1; shift ;;
    --cuda-on-cpu) gpu=cpu; shift ;;
    --edge-node) edge="$2"; shift 2 ;;
    --edge-image) edge_image="$2"; shift 2 ;;
    --edge-platform) edge_platform="$2"; shift 2 ;;
    --edge-memory) edge_memory="$2"; shift 2 ;;
    --device-data) device_data="$2"; shift 2 ;;
    -h|--help) sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *=*) overrides+=("$1"); shift ;;
    *) echo "compose_run: unknown argument $1" >&2; exit 2 ;;
  esac
done

nodes=3  # the services in docker-compose.yml
case "$edge" in ''|[0-2]) ;; *) echo "compose_run: --edge-node takes 0..$((nodes - 1))" >&2; exit 2 ;; esac
APP_UID=49999
mkdir -p "$work"
work=$(cd "$work" && pwd)
export FEDINIT_APP
FEDINIT_APP=$(cd "$app" && pwd)
export FEDINIT_WORK="$work" FEDINIT_RESULTS="$work/results" FEDINIT_NUM_PARTITIONS="$nodes"
export FEDINIT_IMAGE_PREFIX=${FEDINIT_IMAGE_PREFIX:-local/fedinit}
export FEDINIT_IMAGE_TAG=${FEDINIT_IMAGE_TAG:-flwr1.39.0}
export FEDINIT_DATA=${FEDINIT_DATA:-/usr/share/datasets/fashion-mnist}
files=(-f "$repo/docker-compose.yml")
[ "$gpu" = 0 ] || files+=(-f "$repo/docker-compose.gpu.yml")
if [ -n "$device_data" ]; then
  [ -z "$edge" ] || { echo "compose_run: --device-data with --edge-node is not supported" \
    "(deploy/edge/run-docker.sh mounts the shared data set)" >&2; exit 2; }
  [ -d "$device_data" ] || { echo "compose_run: --device-data $device_data is not a folder" \
    "(expected DIR/<i>/ or DIR/<i>.npz for each node i in 0..$((nodes - 1)))" >&2; exit 2; }
  device_data=$(cd "$device_data" && pwd)
  for i in $(seq 0 $((nodes - 1))); do
    if [ -d "$device_data/$i" ]; then
      export "NODE${i}_DATA=$device_data/$i" "NODE${i}_DATA_AT=/data"
    elif [ -f "$device_data/$i.npz" ]; then
      export "NODE${i}_DATA=$device_data/$i.npz" "NODE${i}_DATA_AT=/data.npz"
    else
      echo "compose_run: --device-data $device_data has no data for node $i" \
        "(expected $device_data/$i/, an image folder, or $device_data/$i.npz)" >&2; exit 2
    fi
  done
  for kv in "${overrides[@]}"; do
    case "$kv" in dataset=*) ;; *) continue ;; esac
    [ "$kv" = dataset=device ] || [ "$kv" = 'dataset="device"' ] || { echo "compose_run:" \
      "$kv with --device-data; it takes dataset=device (or none)" >&2; exit 2; }
  done
  # Nobody holds the shared data set: its mounts (the base file's) get an empty folder.
  mkdir -p "$work/no-shared-data"
  export FEDINIT_DATA="$work/no-shared-data"
  files+=(-f "$repo/docker-compose.device-data.yml")
fi
if [ "$gpu" = cpu ]; then
  # Compose v1 cannot unset a key in an override: resolve both files (this validates them),
  # then drop the services' `deploy:` blocks (the nvidia device reservation, which a host
  # without the NVIDIA runtime refuses) and run from the resolved file.
  resolved="$work/compose.cuda-on-cpu.yml"
  docker-compose --project-directory "$repo" "${files[@]}" config > "$resolved.full"
  awk '/^    deploy:$/ {skip = 1; next} skip && /^      / {next} {skip = 0; print}' \
    "$resolved.full" > "$resolved"
  files=(-f "$resolved")
fi
default_type() {  # default_type KEY: "string" when the app's default for KEY is a string
  awk -v key="$1" '/^\[/ {in_cfg = ($0 == "[tool.flwr.app.config]"); next}
    in_cfg && $1 == key && $2 == "=" {print (substr($3, 1, 1) == "\"" ? "string" : "other"); exit}' \
    "$FEDINIT_APP/pyproject.toml"
}
dc() { docker-compose --project-directory "$repo" -p "$project" "${files[@]}" "$@"; }
log() { echo "compose_run: [${SECONDS}s] $*"; }
edge_name="$project-edge-$edge"
sampler=""

cgroup_dir() {  # a container's memory cgroup on the host: v1 cgroupfs, v2 systemd or cgroupfs
  local d
  for d in "/sys/fs/cgroup/memory/docker/$1" "/sys/fs/cgroup/system.slice/docker-$1.scope" \
           "/sys/fs/cgroup/docker/$1"; do
    [ -d "$d" ] && { echo "$d"; return; }
  done
}
working_set() {  # working_set CGROUP: usage - inactive file now (docker stats' figure); 0 unread
  local dir=$1 usage inactive
  # each read may fail while the container starts or stops (the sampler runs under set -e)
  if [ -f "$dir/memory.usage_in_bytes" ]; then
    usage=$(cat "$dir/memory.usage_in_bytes" 2>/dev/null) || usage=0
    inactive=$(awk '$1 == "total_inactive_file" {print $2}' "$dir/memory.stat" 2>/dev/null) \
      || inactive=0
  else
    usage=$(cat "$dir/memory.current" 2>/dev/null) || usage=0
    inactive=$(awk '$1 == "inactive_file" {print $2}' "$dir/memory.stat" 2>/dev/null) \
      || inactive=0
  fi
  echo $(( ${usage:-0} - ${inactive:-0} ))
}
sample_memory() {  # sample_memory CGROUP OUT: the max of working_set while the cgroup lives
  local dir=$1 out=$2 peak=0 now
  while [ -d "$dir" ]; do
    now=$(working_set "$dir")
    if [ "$now" -gt "$peak" ]; then peak=$now; echo "$peak" > "$out"; fi
    sleep 0.5
  done 2>/dev/null
}

# ------------------------------------------------------------------ teardown on any exit
cleanup() {
  local rc=$?
  [ -z "$sampler" ] || kill "$sampler" 2>/dev/null || true
  if [ "$keep" = 1 ]; then
    log "left running; stop with: docker-compose -p $project down -v${edge:+; docker rm -f $edge_name}"
  else
    [ -z "$edge" ] || docker rm -f "$edge_name" >/dev/null 2>&1 || true
    dc --profile cli down -v --remove-orphans >/dev/null 2>&1 || true
    log "stack removed"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ------------------------------------------------------------------ certs, CLI config
"$here/make_certs.sh" --nodes "$nodes" "$work/certs" >/dev/null
mkdir -p "$work/certs/public" "$work/cli" "$work/results" "$work/registry"
cp "$work/certs/ca.crt" "$work/certs"/node_key_*.pub "$work/certs/public/"
cat > "$work/cli/config.toml" <<EOF
[superlink]
default = "compose"

[superlink.compose]
address = "superlink:8000"
root-certificates = "/keys/ca.crt"
EOF
{
  echo "num-clients = $nodes"
  echo 'output-dir = "/results"'
  echo 'node-registry = "/registry/registry.json"'
  [ -z "$device_data" ] || echo 'dataset = "device"'
  for kv in "${overrides[@]}"; do
    key=${kv%%=*}; val=${kv#*=}
    case "$key" in num-clients|output-dir|node-registry) continue ;; esac
    [ "$key" != dataset ] || [ -z "$device_data" ] || continue  # device, checked above
    # TOML scalars as given (numbers, true/false, "quoted"); anything else, or any value for
    # a key whose default is a string, becomes a string.
    if [[ ! "$val" =~ ^\".*\"$ ]] && [ "$(default_type "$key")" = string ]; then
      echo "$key = \"$val\""
    elif [[ "$val" =~ ^-?[0-9]+([.][0-9]+)?([eE][-+]?[0-9]+)?$|^(true|false)$|^\".*\"$ ]]; then
      echo "$key = $val"
    else
      echo "$key = \"$val\""
    fi
  done
} > "$work/cli/run-config.toml"

# ------------------------------------------------------------------ images
need=(superlink serverapp client-cpu)
missing=()
for t in "${need[@]}"; do
  docker image inspect "$FEDINIT_IMAGE_PREFIX-$t:$FEDINIT_IMAGE_TAG" >/dev/null 2>&1 || missing+=("$t")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "building images: ${missing[*]}"
  IMAGE_PREFIX=$FEDINIT_IMAGE_PREFIX IMAGE_TAG=$FEDINIT_IMAGE_TAG "$here/build_images.sh" "${missing[@]}"
fi
if [ "$gpu" != 0 ] && ! docker image inspect "$FEDINIT_IMAGE_PREFIX-client-cuda:$FEDINIT_IMAGE_TAG" >/dev/null 2>&1; then
  echo "compose_run: --gpu needs the client-cuda image: deploy/build_images.sh --cuda client-cuda" >&2
  exit 1
fi

# Containers run as uid 49999: it must read the keys it is given and write its dirs.
if [ "$(id -u)" = 0 ]; then
  chown "$APP_UID:$APP_UID" "$work/certs/server.key" "$work/certs"/node_key_? "$work/cli" \
    "$work/results"
else
  docker run --rm --network none --user 0 -v "$work:/w" "$FEDINIT_IMAGE_PREFIX-superlink:$FEDINIT_IMAGE_TAG" \
    sh -c "chown $APP_UID:$APP_UID /w/certs/server.key /w/certs/node_key_? /w/cli /w/results"
fi

# ------------------------------------------------------------------ SuperLink, registration
dc --profile cli down -v --remove-orphans >/dev/null 2>&1 || true
log "starting superlink + superexec-serverapp"
dc up -d superlink superexec-serverapp
link=$(dc ps -q superlink)
for _ in $(seq 90); do
  [ "$(docker inspect -f '{{.State.Health.Status}}' "$link")" = healthy ] && break
  sleep 1
done
[ "$(docker inspect -f '{{.State.Health.Status}}' "$link")" = healthy ] \
  || { dc logs superlink | tail -20; echo "compose_run: superlink not healthy" >&2; exit 1; }
log "superlink healthy"
registry="{"
for i in $(seq 0 $((nodes - 1))); do
  out=$(dc run --rm -T cli flwr supernode register "/keys/node_key_$i.pub" --format json 2>&1) \
    || { echo "$out" >&2; exit 1; }
  case "$out" in *'"success": true'*) ;; *) echo "$out" >&2; exit 1 ;; esac
  node_id=$(echo "$out" | grep -o '"node-id": *[0-9]*' | grep -o '[0-9]*$')
  [ "$i" = 0 ] || registry+=", "
  registry+="\"$node_id\": $i"
  log "registered node_key_$i.pub as node $node_id"
done
# The operator's registry: the ServerApp uses partition i only from the node registered for it.
echo "$registry}" > "$work/registry/registry.json"

# ------------------------------------------------------------------ SuperNodes
services=()
for i in $(seq 0 $((nodes - 1))); do
  [ "$i" = "$edge" ] || services+=("supernode-$i")
done
dc up -d "${services[@]}"
if [ -n "$edge" ]; then
  # The edge kit, unchanged, pointed at this stack's network and key.
  edge_env="$work/edge-$edge.env"
  mkdir -p "$work/edge-$edge-state"
  cat > "$edge_env" <<EOF
SUPERLINK=superlink:9092
PARTITION_ID=$edge
NUM_PARTITIONS=$nodes
KEY=$work/certs/node_key_$edge
CA=$work/certs/ca.crt
PEER_KEYS=$work/certs/secagg-peer-keys.txt
DATA_DIR=$FEDINIT_DATA
STATE_DIR=$work/edge-$edge-state
IMAGE=${edge_image:-$FEDINIT_IMAGE_PREFIX-client-cpu:$FEDINIT_IMAGE_TAG}
PLATFORM=$edge_platform
NAME=$edge_name
CPUS=1
MEMORY=$edge_memory
NETWORK=${project}_fleet
THREADS=1
EOF
  docker rm -f "$edge_name" >/dev/null 2>&1 || true
  DOCKER_RUN_OPTS="--label fedinit.project=$project" "$here/edge/run-docker.sh" "$edge_env" >/dev/null
  log "edge SuperNode $edge_name (partition $edge, ${edge_platform:-native}, --cpus 1 --memory $edge_memory) started"
  edge_id=$(docker inspect -f '{{.Id}}' "$edge_name")
  for _ in 1 2 3 4 5 6 7 8 9 10; do  # a cgroup the engine has not made yet: look again
    edge_cgroup=$(cgroup_dir "$edge_id") || true
    [ -z "$edge_cgroup" ] || break
    sleep 0.5
  done
  if [ -n "$edge_cgroup" ]; then
    echo 0 > "$work/edge-$edge.peak"
    sample_memory "$edge_cgroup" "$work/edge-$edge.peak" &
    sampler=$!
  fi
fi
log "SuperNodes up"

# ------------------------------------------------------------------ run
run_log="$work/flwr-run.log"
touch "$work/.run-started"  # the run's results directory is the one created after this
dc run --rm -T cli flwr run /app compose --run-config /flwr/run-config.toml --stream 2>&1 \
  | tee "$run_log"
run_id=$(grep -o 'Successfully started run [0-9]*' "$run_log" | awk '{print $4}' | head -1)
[ -n "$run_id" ] || { echo "compose_run: flwr run did not start a run" >&2; exit 1; }
status_json=$(dc run --rm -T cli flwr ls compose --run-id "$run_id" --format json 2>&1)
status=$(echo "$status_json" | grep -o '"status": "[^"]*"' | head -1 | cut -d'"' -f4)
log "run $run_id status ${status:-unknown}"

# The server writes config.json into the run's directory before round 1 (read from the files,
# not from the log, whose wording and colour codes are not an interface).
results=$(find "$work/results" -mindepth 2 -maxdepth 2 -name config.json -newer "$work/.run-started" \
          -printf '%h\n' 2>/dev/null | head -1)
if [ -n "$results" ]; then
  log "results in $results"
fi

if [ -n "$edge" ]; then
  mib() { echo $(( ${1:-0} / 1048576 )); }
  # The kernel's high-water mark counts page cache (torch's libraries) too; the sampled
  # working set (usage - inactive file, as docker stats shows) is what the node really needs.
  hwm=$(docker exec "$edge_name" cat /sys/fs/cgroup/memory/memory.max_usage_in_bytes 2>/dev/null \
        || docker exec "$edge_name" cat /sys/fs/cgroup/memory.peak 2>/dev/null || echo 0)
  ws=$(cat "$work/edge-$edge.peak" 2>/dev/null || echo 0)
  if [ -n "$edge_cgroup" ] && [ -d "$edge_cgroup" ]; then  # one last sample: the peak is no less
    now=$(working_set "$edge_cgroup")
    [ "$now" -le "${ws:-0}" ] || ws=$now
  fi
  log "edge peak memory: working set $(mib "$ws") MiB, cgroup high-water $(mib "$hwm") MiB" \
      "(limit $edge_memory, OOM-killed: $(docker inspect -f '{{.State.OOMKilled}}' "$edge_name"))"
  if [ -n "$results" ] && [ -f "$results/rounds.jsonl" ]; then
    log "edge seconds per round: $(grep -o '"round-seconds": [0-9.]*' "$results/rounds.jsonl" \
          | awk '{s += $2; n++} END {if (n) printf "%.1f", s / n}') (mean round of the federation)"
  fi
  docker logs "$edge_name" > "$work/edge-$edge.log" 2>&1 || true
fi
[ "$status" = finished:completed ]
