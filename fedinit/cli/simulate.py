"""Run one experiment in Flower's simulation engine through ``flwr run``.

    .venv/bin/fedinit-simulate                                # the default experiment
    .venv/bin/fedinit-simulate beta=0 num-server-rounds=20 seed=1

Arguments are run-config overrides ``key=value`` (strings need no quotes). The config and the
data set's presence are checked here first, with the standard library only, so a bad value
fails in well under a second with one line; then the federation is sized to ``num-clients``,
the run goes to this checkout's own local SuperLink, and its per-round log is streamed. The
exit status is 0 only if Flower reports the run ``finished:completed`` (``flwr run --stream``
alone exits 0 on failure).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

from fedinit.cli.flower_env import OFFLINE_ENV, REPO, flower_env
from fedinit.cli.flower_output import clean_line
from fedinit.cli.refusals import Refused, refuses, refusing
from fedinit.cli.superlink_port import foreign_superlink
from fedinit.config import ConfigError, RunConfig, check_writable
from fedinit.flower_compat.app_source import staged_app
from fedinit.task.data_paths import DataNotFoundError, check_present

RUN_ID = re.compile(r"Successfully started run (\d+)")


def parse_value(text: str) -> Any:
    """A TOML scalar if it parses as one (number, bool, quoted string), else the raw string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """``key=value`` arguments as run-config overrides; ValueError names a malformed item."""
    overrides: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep:
            raise ValueError(f"{item!r} is not key=value")
        overrides[key] = parse_value(text)
    return overrides


def toml_line(key: str, value: Any) -> str:
    """``key = value`` in TOML, as ``flwr run --run-config FILE`` reads it."""
    if isinstance(value, bool):
        return f"{key} = {str(value).lower()}"
    if isinstance(value, str):
        return f"{key} = {json.dumps(value)}"
    return f"{key} = {value!r}"


@refuses("simulate")
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("overrides", nargs="*", metavar="key=value")
    ap.add_argument("--num-cpus-per-client", type=float, default=1.0,
                    help="Ray CPUs per simulated client (default 1: one client per core)")
    ap.add_argument("--num-gpus-per-client", type=float, default=0.0,
                    help="Ray GPUs per simulated client (e.g. 0.25 on a GPU host)")
    args = ap.parse_args(argv)

    with refusing(ValueError, prefix="argument "):
        overrides = parse_overrides(args.overrides)
    with refusing(ConfigError, DataNotFoundError):
        cfg = RunConfig.parse(overrides)
        if not cfg.fleet.resume_dir:
            check_writable("output-dir", Path(cfg.fleet.output_dir).resolve())
        if cfg.data.on_devices:
            raise ConfigError("run config: dataset='device' needs a deployment: each "
                              "SuperNode's node config names its own data-dir, and simulated "
                              "nodes have none (deploy/edge/README.md, 'Bring your own data')")
        data_dir = Path(cfg.data.resolved_data_dir).resolve()
        check_present(cfg.data.dataset, data_dir)
    # Absolute paths: the apps run from Flower's install of the FAB, not from this checkout,
    # so a default found next to the checkout is passed too (a system default is left "", as
    # a checkpoint made without it must still match on resume).
    overrides["output-dir"] = str(Path(cfg.fleet.output_dir).resolve())
    if cfg.data.data_dir or data_dir.is_relative_to(REPO.parent):
        overrides["data-dir"] = str(data_dir)

    env = flower_env()
    problem = foreign_superlink(env, OFFLINE_ENV)
    if problem:
        raise Refused(problem)
    home = Path(env["FLWR_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    run_cfg_file = home / "last-run-config.toml"
    run_cfg_file.write_text("\n".join(toml_line(k, v) for k, v in overrides.items()) + "\n")
    fed = (f"num-supernodes={cfg.num_clients}"
           f" client-resources-num-cpus={args.num_cpus_per_client:g}"
           f" client-resources-num-gpus={args.num_gpus_per_client:g}")
    with staged_app(REPO) as app:  # the app's files only: Flower lists all it is given
        cmd = ["flwr", "run", str(app), "local", "--run-config", str(run_cfg_file),
               "--federation-config", fed, "--stream"]
        shown = [str(REPO) if part == str(app) else part for part in cmd]
        print("simulate:", " ".join(shown), f"(its FAB built from a copy of the app's files in "
              f"{app})" if app != REPO else "", flush=True)
        run_id, _ = stream_run(cmd, env)
    status = run_status(env, run_id) if run_id else "unknown (the run did not start)"
    print(f"simulate: run status {status}", flush=True)
    return 0 if status == "finished:completed" else 1


def stream_run(cmd: list[str], env: dict[str, str]) -> tuple[str | None, str]:
    """Run ``flwr run --stream``, echoing its output; return (run id, the whole output)."""
    run_id = None
    lines: list[str] = []
    colour = sys.stdout.isatty()
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, bufsize=1) as proc:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = clean_line(raw, colour)
            if line is None:
                continue
            sys.stdout.write(line)
            lines.append(line)
            match = RUN_ID.search(line)
            if match and run_id is None:
                run_id = match.group(1)
    return run_id, "".join(lines)


def run_status(env: dict[str, str], run_id: str, connection: str = "local") -> str:
    """A run's status from ``flwr ls --run-id ID --format json`` (e.g. finished:completed)."""
    out = subprocess.run(["flwr", "ls", connection, "--run-id", run_id, "--format", "json"],
                         env=env, check=False, capture_output=True, text=True).stdout
    try:
        runs = json.loads(out[out.index("{"):])["runs"]
        return str(runs[0]["status"])
    except (ValueError, KeyError, IndexError):
        return f"unknown ({out.strip()[:200]})"


if __name__ == "__main__":
    sys.exit(main())
