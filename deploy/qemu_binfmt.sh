#!/usr/bin/env bash
# Make this x86_64 host run aarch64 binaries (arm64 images, debootstrap's second stage) via
# qemu-user-static: mount binfmt_misc if needed and register qemu-aarch64 with the F flag
# (the interpreter is opened now, so it also works inside containers and chroots).
#
#   deploy/qemu_binfmt.sh            exit 0: ready; 3: binfmt_misc cannot be mounted here (or
#                                    not as this user); 1: anything else (no qemu-user-static)
#
# Root only. Installs Debian's qemu-user-static with apt when it is missing (CI machines).
# Idempotent: a second run changes nothing.
set -euo pipefail

bfm=/proc/sys/fs/binfmt_misc
entry=$bfm/qemu-aarch64
if [ -f "$entry" ] && grep -q '^enabled' "$entry" && grep -q '^flags: .*F' "$entry"; then
  echo "qemu_binfmt: qemu-aarch64 registered ($(sed -n 's/^interpreter //p' "$entry"))"
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "qemu_binfmt: binfmt_misc cannot be mounted or written without root" >&2; exit 3
fi

conf=/usr/lib/binfmt.d/qemu-aarch64.conf
if [ ! -f "$conf" ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq || true
  apt-get install -y -qq qemu-user-static >/dev/null
fi
[ -f "$conf" ] || { echo "qemu_binfmt: $conf missing after installing qemu-user-static" >&2; exit 1; }

if [ ! -f "$bfm/register" ]; then
  if ! err=$(mount -t binfmt_misc binfmt_misc "$bfm" 2>&1); then
    echo "qemu_binfmt: binfmt_misc cannot be mounted here: $err" >&2
    exit 3
  fi
fi
# An entry without the F flag (or disabled) would fail inside containers: replace it.
[ ! -f "$entry" ] || echo -1 > "$entry"
grep -v '^#' "$conf" > "$bfm/register"
grep -q '^flags: .*F' "$entry" || { echo "qemu_binfmt: registered without the F flag" >&2; exit 1; }
echo "qemu_binfmt: registered qemu-aarch64 ($(sed -n 's/^interpreter //p' "$entry"))"
