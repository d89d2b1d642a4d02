#!/usr/bin/env bash
# TLS and SuperNode-auth material for a Flower deployment (process, docker-compose, edge).
#
#   deploy/make_certs.sh [-n NODES] [--san ENTRY]... OUT_DIR
#       OUT_DIR/ca.key ca.crt         a private CA (keep ca.key on the SuperLink operator's side)
#       OUT_DIR/server.key server.pem  the SuperLink's certificate, SAN localhost, 127.0.0.1,
#                                     ::1, superlink (the compose service name) + each --san
#       OUT_DIR/node_key_I{,.pub}     SuperNode auth keys (ECDSA P-384, OpenSSH format), I < NODES
#       OUT_DIR/secagg-peer-keys.txt  the operator's peer list for signed SecAgg+ keys: client I
#                                     (= partition I) and node_key_I.pub, one a line (node
#                                     config secagg-peer-keys; deploy/edge/README.md)
#   deploy/make_certs.sh --node-key NAME OUT_DIR
#       only OUT_DIR/NAME{,.pub}: what an edge device makes for itself (no CA needed)
#
# Idempotent: existing files are kept, so re-running adds missing node keys without
# invalidating registered keys or the CA that nodes already trust. The server certificate is
# re-issued (same CA) only when the requested SAN list changes.
set -euo pipefail

usage() { sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }

nodes=0
days=365
node_key=""
sans=("DNS:localhost" "DNS:superlink" "IP:127.0.0.1" "IP:::1")
out=""
while [ $# -gt 0 ]; do
  case "$1" in
    -n|--nodes) nodes="$2"; shift 2 ;;
    --san) sans+=("$2"); shift 2 ;;
    --days) days="$2"; shift 2 ;;
    --node-key) node_key="$2"; shift 2 ;;
    -h|--help) usage 0 ;;
    -*) echo "make_certs: unknown option $1" >&2; usage 2 ;;
    *) out="$1"; shift ;;
  esac
done
[ -n "$out" ] || usage 2
case "$nodes" in ''|*[!0-9]*) echo "make_certs: --nodes needs a number" >&2; exit 2 ;; esac
for tool in openssl ssh-keygen; do
  command -v "$tool" >/dev/null || { echo "make_certs: $tool not found (apt-get install openssl openssh-client)" >&2; exit 1; }
done

mkdir -p "$out"
umask 077  # private keys readable by their owner only; public files are chmod'ed below

# ECDSA P-384: the key type Flower accepts for SuperNode auth (NIST curves only).
make_node_key() {
  local path="$out/$1"
  if [ ! -f "$path" ]; then
    ssh-keygen -q -t ecdsa -b 384 -N "" -C "fedinit-$1" -f "$path"
    echo "make_certs: node key $path (+ .pub)"
  fi
  chmod 644 "$path.pub"
}

if [ -n "$node_key" ]; then
  make_node_key "$node_key"
  exit 0
fi

# EC keys for CA and server: as strong as RSA-4096 for this purpose and generated instantly.
if [ ! -f "$out/ca.key" ] || [ ! -f "$out/ca.crt" ]; then
  openssl ecparam -name secp384r1 -genkey -noout -out "$out/ca.key"
  openssl req -new -x509 -key "$out/ca.key" -sha384 -days "$days" \
    -subj "/CN=FedInit Flower CA" -out "$out/ca.crt"
  rm -f "$out/server.pem"  # a new CA invalidates the old server certificate
  echo "make_certs: CA $out/ca.crt"
fi
chmod 644 "$out/ca.crt"

san_list=$(IFS=,; echo "${sans[*]}")
if [ ! -f "$out/server.pem" ] || [ "$(cat "$out/server.san" 2>/dev/null)" != "$san_list" ]; then
  [ -f "$out/server.key" ] || openssl ecparam -name secp384r1 -genkey -noout -out "$out/server.key"
  cnf="$out/server.cnf"
  cat > "$cnf" <<EOF
[req]
distinguished_name = dn
prompt = no
[dn]
CN = superlink
[v3_req]
basicConstraints = CA:FALSE
keyUsage = digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = $san_list
EOF
  openssl req -new -key "$out/server.key" -config "$cnf" -out "$out/server.csr"
  openssl x509 -req -in "$out/server.csr" -CA "$out/ca.crt" -CAkey "$out/ca.key" \
    -CAcreateserial -days "$days" -sha384 -extfile "$cnf" -extensions v3_req \
    -out "$out/server.pem" 2>/dev/null
  rm -f "$out/server.csr" "$cnf"
  echo "$san_list" > "$out/server.san"
  echo "make_certs: server certificate $out/server.pem ($san_list)"
fi
chmod 644 "$out/server.pem"

i=0
while [ "$i" -lt "$nodes" ]; do
  make_node_key "node_key_$i"
  i=$((i + 1))
done

# The peer list is public and derived from the .pub files: rewritten on every run, so it
# always lists exactly node_key_0..NODES-1.
if [ "$nodes" -gt 0 ]; then
  peers="$out/secagg-peer-keys.txt"
  { echo "# client id, then its node key's .pub line (deploy/make_certs.sh)"
    i=0
    while [ "$i" -lt "$nodes" ]; do
      echo "$i $(cat "$out/node_key_$i.pub")"
      i=$((i + 1))
    done; } > "$peers.tmp"
  chmod 644 "$peers.tmp"
  mv "$peers.tmp" "$peers"
fi
