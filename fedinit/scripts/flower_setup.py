"""Make plain ``flwr run .`` safe in the set-up environment (run by ``scripts/setup.sh``).

Flower 1.39 reads its offline switches and local SuperLink ports only from the environment of
the ``flwr`` process (``flwr/cli/constant.py``, ``flwr/superlink/cli/flower_superlink.py``),
and a local simulation's size only from ``--federation-config`` or the connection's
``options`` in ``$FLWR_HOME/config.toml`` (``flwr/cli/run/run.py``); nothing of either comes
from the app's pyproject. So setup writes both where a Flower user's shell picks them up:

- ``.venv/bin/activate`` exports the offline switches, ``FLWR_HOME=<checkout>/.flwr`` and this
  checkout's own local SuperLink ports (a block between markers, rewritten on every setup);
- ``<checkout>/.flwr/config.toml`` makes the default connection a local simulation of
  ``num-clients`` SuperNodes (from pyproject's defaults), one CPU each.

Both are generated from ``fedinit.cli.flower_env`` and pyproject, the single sources of the values.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tomllib
from pathlib import Path

from fedinit.cli.flower_env import OFFLINE_ENV, RAY_SINGLE_MACHINE, REPO
from fedinit.cli.superlink_port import CONTROL_PORT_ENV, HTTP_PORT_ENV, checkout_ports
from fedinit.config import load_defaults

BEGIN = "# >>> fedinit: Flower offline settings (scripts/setup.sh) >>>"
END = "# <<< fedinit <<<"
CONNECTION = "fedinit-sim"
CONFIG_MARK = "# Written by scripts/setup.sh (fedinit)."


def shell_env(repo: Path = REPO) -> dict[str, str]:
    """The variables the activate block sets; FLWR_HOME and the ports only when unset."""
    http, control = checkout_ports(repo)
    return {**OFFLINE_ENV, RAY_SINGLE_MACHINE: "0", "FLWR_HOME": str(repo / ".flwr"),
            HTTP_PORT_ENV: http, CONTROL_PORT_ENV: control}


OVERRIDABLE = ("FLWR_HOME", HTTP_PORT_ENV, CONTROL_PORT_ENV, RAY_SINGLE_MACHINE)


def activate_block(repo: Path = REPO) -> str:
    """The lines appended to .venv/bin/activate."""
    lines = [BEGIN]
    for key, value in shell_env(repo).items():
        quoted = shlex.quote(value)
        lines.append(f'export {key}="${{{key}:-{value}}}"' if key in OVERRIDABLE
                     else f"export {key}={quoted}")
    lines.append(END)
    return "\n".join(lines) + "\n"


def with_block(text: str, block: str) -> str:
    """``text`` with the marked block replaced by ``block`` (appended if absent)."""
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        tail = rest.split(END, 1)[1].lstrip("\n")
        text = head + tail
    return text.rstrip("\n") + "\n\n" + block


def flower_config(num_supernodes: int) -> str:
    """$FLWR_HOME/config.toml: plain ``flwr run .`` simulates ``num_supernodes`` nodes."""
    return f"""{CONFIG_MARK} Plain `flwr run .` uses the default connection below:
# a local simulation of num-clients SuperNodes (pyproject's default), one CPU each.
# Flower warns that `options.` is deprecated; it is the only setting of the size that lasts
# across SuperLink restarts in flwr 1.39.
[superlink]
default = "{CONNECTION}"

[superlink.{CONNECTION}]
address = ":local:"
options.num-supernodes = {num_supernodes}
options.backend.client-resources.num-cpus = 1

[superlink.local]
address = ":local:"

[superlink.supergrid]
address = "api.flower.ai"
"""


def write_if_changed(path: Path, text: str) -> bool:
    """Write ``text`` unless ``path`` already holds it; True when it wrote."""
    if path.is_file() and path.read_text() == text:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return True


def replaceable(text: str) -> bool:
    """Whether a config.toml is ours or the default Flower writes on first use (a `local`
    connection without options and `supergrid`), so setup may replace it; any other is the
    user's and is left alone."""
    if CONFIG_MARK in text:
        return True
    try:
        links = tomllib.loads(text).get("superlink", {})
    except tomllib.TOMLDecodeError:
        return False
    return (set(links) <= {"default", "local", "supergrid"} and links.get("default") == "local"
            and links.get("local") == {"address": ":local:"})


def install(venv: Path, flwr_home: Path) -> list[str]:
    """Write the activate block and the Flower config; the paths that changed."""
    changed = []
    activate = venv / "bin" / "activate"
    if write_if_changed(activate, with_block(activate.read_text(), activate_block())):
        changed.append(str(activate))
    config = flwr_home / "config.toml"
    if config.is_file() and not replaceable(config.read_text()):
        print(f"flower_setup: {config} was not written by setup; left as it is", file=sys.stderr)
    elif write_if_changed(config, flower_config(int(load_defaults()["num-clients"]))):
        changed.append(str(config))
    return changed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--venv", type=Path, default=REPO / ".venv")
    ap.add_argument("--flwr-home", type=Path, default=REPO / ".flwr")
    args = ap.parse_args(argv)
    for path in install(args.venv, args.flwr_home):
        print(f"flower_setup: wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
