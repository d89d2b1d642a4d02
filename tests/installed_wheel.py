"""The project as a user installs it: the wheel built from this checkout, installed (not
editable) into a fresh environment, so a test can run from a directory outside the checkout
and see only what the wheel holds.

The machine is offline, so the fresh environment takes the pinned dependencies (flwr, torch,
...) from the test venv's site-packages by one ``.pth`` line; that directory's own ``.pth``
files (among them the checkout's editable-install finder) are not processed from there, so
nothing of the checkout is importable. The dependencies' commands (``flwr``,
``flower-superlink``, ...) are copied with the fresh interpreter as their shebang, so every
process a run starts imports the installed wheel.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from fedinit.cli.flower_env import REPO

TOP_LEVEL = {"strategies", "server_app", "client_app", "fedinit"}
"""What the wheel puts at the top of site-packages: the card's three packages and the
project's namespace."""


SOURCES = ("pyproject.toml", "setup.py", *sorted(TOP_LEVEL))
"""What the wheel is built from: setuptools writes its build/ and egg-info next to them, so
they are copied out of the checkout first."""


def build_wheel(out: Path) -> Path:
    """The checkout's wheel, built without network or build isolation (setuptools is in the
    test venv), in ``out``."""
    source = out / "source"
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name,
                            ignore=shutil.ignore_patterns("__pycache__"))
        else:
            source.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "--no-index", "-q", "-w", str(out), str(source)], check=True, cwd=out,
                   capture_output=True, text=True, timeout=300)
    wheels = sorted(out.glob("fedinit_flower-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


PY = f"{sys.version_info.major}.{sys.version_info.minor}"


def site_packages(root: Path) -> Path:
    """A venv's site-packages."""
    return root / "lib" / f"python{PY}" / "site-packages"


def fresh_environment(root: Path, wheel: Path) -> Path:
    """A venv at ``root`` with ``wheel`` installed and the test venv's dependencies reachable;
    returns its bin directory."""
    base_python = Path(sys.base_prefix) / "bin" / f"python{PY}"
    subprocess.run([str(base_python), "-m", "venv", "--without-pip", str(root)], check=True,
                   timeout=120)
    deps = Path(sysconfig.get_paths()["purelib"])
    (site_packages(root) / "test-venv-deps.pth").write_text(f"{deps}\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(root / "bin" / "python"),
                    "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True,
                   capture_output=True, text=True, timeout=300)
    bindir = root / "bin"
    shebang = f"#!{Path(sys.executable).parent}/"
    for tool in Path(sys.executable).parent.iterdir():
        target = bindir / tool.name
        if target.exists() or not tool.is_file():
            continue
        try:
            text = tool.read_text()
        except UnicodeDecodeError:
            continue
        if text.startswith(shebang):
            rest = text.partition("\n")[2]
            target.write_text(f"#!{bindir / 'python'}\n{rest}")
            target.chmod(0o755)
    return bindir


def installed_env(bindir: Path, base: dict[str, str]) -> dict[str, str]:
    """``base`` with the fresh environment first on PATH and no PYTHONPATH (nothing of the
    checkout on the path)."""
    env = {k: v for k, v in base.items() if k != "PYTHONPATH"}
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(bindir.parent)
    return env
