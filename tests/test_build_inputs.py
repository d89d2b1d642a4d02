"""deploy/build_images.sh skips an image whose inputs are unchanged (fast: its ``inputs_hash``
run alone, with a stand-in ``docker``): the hash moves with what the image is built from and
with nothing else."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from fedinit.cli.flower_env import REPO

SCRIPT = REPO / "deploy" / "build_images.sh"


def hashes(tmp: Path, *targets: str) -> list[str]:
    """``inputs_hash`` of each target over the context ``tmp/w`` (the base image id: 'b1')."""
    function = re.search(r"^inputs_hash\(\) \{.*?^\}", SCRIPT.read_text(), re.S | re.M)
    assert function, "no inputs_hash in build_images.sh"
    fake = tmp / "bin" / "docker"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text("#!/bin/sh\necho sha256:b1\n")
    fake.chmod(0o755)
    script = (f"set -euo pipefail; here={SCRIPT.parent}; wheels={tmp / 'w'}; arch=amd64; "
              f"platform=(); BASE_IMAGE=b; TORCH_SPEC=t; CUDA_TORCH_SPEC=c\n{function[0]}\n"
              + "".join(f"inputs_hash {t}\n" for t in targets))
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True,
                         env={"PATH": f"{fake.parent}:/usr/bin:/bin"})
    return out.stdout.split()


def test_the_inputs_hash_moves_with_the_images_inputs_only(tmp_path: Path) -> None:
    w = tmp_path / "w"
    for (folder, name), text in {("common", "flwr.whl"): "a", ("cuda", "torch.whl"): "big",
                                 ("fedinit/node", "a.py"): "x = 1",
                                 ("fedinit/flower_compat", "b.py"): "y",
                                 (".", "common.stamp"): "flwr==1.39.0"}.items():
        (w / folder).mkdir(parents=True, exist_ok=True)
        (w / folder / name).write_text(text)
    cpu, cuda, link = hashes(tmp_path, "client-cpu", "client-cuda", "superlink")
    assert len({cpu, cuda, link}) == 3 and all(len(h) == 64 for h in (cpu, cuda, link))
    assert hashes(tmp_path, "client-cpu") == [cpu]  # nothing changed: the same hash
    (w / "cuda" / "torch.whl").write_text("bigger")  # outside client-cpu's context
    (w / "common.stamp").write_text("other")  # a stamp is not sent to docker
    assert hashes(tmp_path, "client-cpu") == [cpu]
    assert hashes(tmp_path, "client-cuda") != [cuda]
    (w / "fedinit" / "node" / "a.py").write_text("x = 2")  # a copied source, same size
    assert hashes(tmp_path, "client-cpu") != [cpu]
