#!/usr/bin/env bash
# Start this device's Flower SuperNode as one container of the client-cpu image.
#
#   deploy/edge/run-docker.sh [node.env]        (default: node.env beside this script)
#
# The SuperNode runs its ClientApp in a subprocess (isolation `subprocess`), so one container
# is the whole client. Mounted: the private key and CA certificate read-only, the data set
# read-only, and STATE_DIR as Flower's home, where the ClientApp also mirrors its per-client
# state (node config state-dir) so a restarted node resumes. Limited to CPUS cores and MEMORY (no swap).
# Run as root, the key and state dir are given to the image's user (uid 49999); run as another
# user (in the docker group), the container runs as that user, who owns them already.
# Extra `docker run` options (e.g. --rm instead of a restart policy) go in DOCKER_RUN_OPTS.
set -euo pipefail

env_file=${1:-$(dirname "$0")/node.env}
[ -f "$env_file" ] || { echo "run-docker: $env_file not found (copy node.env.example)" >&2; exit 2; }
# shellcheck disable=SC1090,SC1091  # the operator's node.env (see node.env.example)
. "$env_file"
for f in "$KEY" "$CA"; do
  [ -r "$f" ] || { echo "run-docker: cannot read $f" >&2; exit 2; }
done
mkdir -p "$STATE_DIR"
if [ "$(id -u)" = 0 ]; then
  user=49999:49999
  chown 49999:49999 "$KEY" "$STATE_DIR"
else
  user="$(id -u):$(id -g)"
fi
# PEER_KEYS (optional): the operator's peer list; with it the node signs its secure-aggregation
# keys with its node key and verifies its neighbours' (deploy/edge/README.md, "Signed keys").
signed=()
node_config="partition-id=$PARTITION_ID num-partitions=$NUM_PARTITIONS state-dir=\"/flwr/client-state\""
if [ -n "${PEER_KEYS:-}" ]; then
  [ -r "$PEER_KEYS" ] || { echo "run-docker: cannot read PEER_KEYS $PEER_KEYS" >&2; exit 2; }
  signed=(-v "$(realpath "$PEER_KEYS")":/keys/secagg-peer-keys.txt:ro)
  node_config+=" secagg-signing-key=\"/keys/node_key\" secagg-peer-keys=\"/keys/secagg-peer-keys.txt\""
fi
read -r -a opts <<< "${DOCKER_RUN_OPTS:---restart unless-stopped}"
# PLATFORM (optional): the image's platform when it is not the host's, e.g. linux/arm64 run
# under qemu emulation on an x86 host; empty on a device running its own architecture.
platform=()
[ -z "${PLATFORM:-}" ] || platform=(--platform "$PLATFORM")

docker run -d --name "$NAME" --user "$user" "${platform[@]}" "${opts[@]}" \
  --cpus "$CPUS" --memory "$MEMORY" --memory-swap "$MEMORY" --network "$NETWORK" \
  -e OMP_NUM_THREADS="${THREADS:-1}" -e MKL_NUM_THREADS="${THREADS:-1}" \
  -v "$(realpath "$KEY")":/keys/node_key:ro -v "$(realpath "$CA")":/keys/ca.crt:ro "${signed[@]}" \
  -v "$(realpath "$DATA_DIR")":/usr/share/datasets/fashion-mnist:ro \
  -v "$(realpath "$STATE_DIR")":/flwr \
  "$IMAGE" \
  python -m fedinit.node.launch -- --superlink "$SUPERLINK" --root-certificates /keys/ca.crt \
    --auth-supernode-private-key /keys/node_key \
    --node-config "$node_config"
