"""The local SuperLink port of this checkout, and whether whoever holds it is ours.

``flwr run`` joins whatever answers on its local SuperLink port (``flwr/cli/local_superlink.py``:
a health probe, then no questions), and that SuperLink's environment decides runtime
dependency installation and the venv. So each checkout gets its own pair of ports, derived
from its path, and before a run the commands (``fedinit/cli/``) check that a SuperLink already on
that port was started from this checkout's Flower home with the offline switches; otherwise they
refuse with one line instead of handing the run to it.
"""

from __future__ import annotations

import socket
import zlib
from pathlib import Path

HTTP_PORT_ENV = "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT"
CONTROL_PORT_ENV = "FLWR_LOCAL_CONTROL_API_PORT"
PORT_BASE, PORT_SLOTS = 40000, 500


def checkout_ports(repo: Path) -> tuple[str, str]:
    """(HTTP API port, Control API port) for a checkout: 40000..41996, stable per path,
    away from Flower's defaults (39091/39093) that every other venv and checkout uses."""
    http = PORT_BASE + 4 * (zlib.crc32(str(repo).encode()) % PORT_SLOTS)
    return str(http), str(http + 2)


def listening(port: int, host: str = "127.0.0.1") -> bool:
    """True when something accepts TCP connections on host:port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def _proc_args(pid: str) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _proc_env(pid: str) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)


def superlinks_on(port: str) -> list[str]:
    """Pids of the ``flower-superlink`` processes started with ``--port PORT``."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        args = _proc_args(proc.name)
        if any(a.endswith("flower-superlink") for a in args[:2]) and \
                any(a == "--port" and b == port for a, b in zip(args, args[1:], strict=False)):
            pids.append(proc.name)
    return pids


def foreign_superlink(env: dict[str, str], required: dict[str, str]) -> str | None:
    """Why the SuperLink on this environment's local port is not ours, or None when the port
    is free or holds a SuperLink started from ``env``'s FLWR_HOME with ``required`` set."""
    port = env.get(HTTP_PORT_ENV, "39091")
    if not listening(int(port)):
        return None
    database = str(Path(env["FLWR_HOME"]) / "local-superlink" / "state.db")
    hint = (f"stop it, or choose free ports with {HTTP_PORT_ENV} and {CONTROL_PORT_ENV}")
    pids = superlinks_on(port)
    if not pids:
        return f"127.0.0.1:{port} is taken by a process that is not a local SuperLink; {hint}"
    for pid in pids:
        args, penv = _proc_args(pid), _proc_env(pid)
        if database not in args:
            return (f"127.0.0.1:{port} holds a SuperLink (pid {pid}) of another Flower home, "
                    f"not {env['FLWR_HOME']}; {hint}")
        missing = [k for k, v in required.items() if penv.get(k) != v]
        if missing:
            return (f"127.0.0.1:{port} holds a SuperLink (pid {pid}) started without "
                    f"{', '.join(f'{k}={required[k]}' for k in missing)}; {hint}")
    return None
