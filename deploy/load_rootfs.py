"""Write a root-filesystem tar as a one-layer `docker load` archive for a given architecture.

    python3 deploy/load_rootfs.py ROOTFS.tar IMAGE:TAG arm64 | docker load

Why not `docker import --platform linux/arm64`: Docker 20.10 (Debian's docker.io) ignores the
flag and labels the image with the host's architecture; `docker build --platform linux/arm64`
then refuses the stages built on it ("does not match the specified platform"). A docker-save
archive carries the architecture in its image config, which every build step inherits.
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
import tarfile
import time
from pathlib import Path


def add_bytes(out: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime = len(data), int(time.time())
    out.addfile(info, io.BytesIO(data))


def main() -> None:
    rootfs, tag, arch = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    digest = hashlib.sha256()
    with rootfs.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    diff_id = f"sha256:{digest.hexdigest()}"
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    config = json.dumps({
        "architecture": arch, "os": "linux", "created": created,
        "config": {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                           "LANG=C.UTF-8"], "Cmd": ["python3"]},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": created, "created_by": "debootstrap (deploy/build_images.sh)"}],
    }, sort_keys=True).encode()
    config_name = f"{hashlib.sha256(config).hexdigest()}.json"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [tag],
                            "Layers": ["layer/layer.tar"]}]).encode()
    with tarfile.open(fileobj=sys.stdout.buffer, mode="w|") as out:
        add_bytes(out, config_name, config)
        add_bytes(out, "manifest.json", manifest)
        out.add(rootfs, arcname="layer/layer.tar")


if __name__ == "__main__":
    main()
