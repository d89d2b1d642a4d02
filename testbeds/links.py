"""Network namespaces joined to the root namespace by veth pairs, rate-limited by ``tbf``:
a device's link as the kernel carries it. This kernel has no ``netem``, so latency, held-back
chunks, resets and cuts come from ``testbeds/fault_proxy.py`` on the path instead.

Namespace names carry the creating process's pid (``<prefix>-<pid>-<i>``), so a later run
removes what a killed one left (``remove_stale``) and never touches a live run's."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass, field

PREFIX = "fl44"
"""Namespace and interface name prefix of this testbed (issue 44)."""


class LinkError(RuntimeError):
    """A namespace, veth pair or qdisc could not be made (the command and its stderr)."""


def ip(*args: str) -> str:
    """Run ``ip ARGS`` (or ``tc`` when the first argument is "tc"); LinkError on failure."""
    cmd = list(args) if args[0] == "tc" else ["ip", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=30)
    if proc.returncode != 0:
        raise LinkError(f"{' '.join(cmd)}: {proc.stderr.strip()}")
    return proc.stdout


def unavailable() -> str:
    """Why this machine cannot make the testbed ('' when it can): root and iproute2."""
    if os.geteuid() != 0:
        return "the link testbed (network namespaces, veth pairs, tbf) runs as root only"
    if not (shutil.which("ip") and shutil.which("tc")):
        return "iproute2 (ip, tc) is not installed: apt-get install -y iproute2"
    return ""


@dataclass(frozen=True)
class Link:
    """One node's link: namespace ``ns``; ``host_ip`` on the root side (where the proxy
    listens), ``ns_ip`` inside."""

    ns: str
    host_if: str
    ns_if: str
    host_ip: str
    ns_ip: str

    def exec_prefix(self) -> list[str]:
        """Run a command inside the namespace (``ip netns exec`` execs it: same pid)."""
        return ["ip", "netns", "exec", self.ns]


def tbf(dev: str, mbit: float, ns: str = "") -> None:
    """Limit ``dev``'s egress to ``mbit`` Mbit/s (a 16 kB bucket, 400 ms of queue)."""
    where = ["netns", "exec", ns] if ns else []
    ip(*where, "tc", "qdisc", "replace", "dev", dev, "root", "tbf",
       "rate", f"{int(mbit * 1000)}kbit", "burst", "16kb", "latency", "400ms")


@dataclass
class Namespaces:
    """The links of one testbed; ``close()`` kills what runs in them and deletes them."""

    subnet: int = 201
    """Second octet of the links' 10.<subnet>.<i>.0/30 networks."""
    links: list[Link] = field(default_factory=list)

    def tag(self, i: int) -> str:
        return f"{PREFIX}-{os.getpid()}-{i}"

    def add(self, i: int, up_mbit: float = 0.0, down_mbit: float = 0.0) -> Link:
        """Namespace ``i`` with a veth pair to the root namespace; up (node to link) and
        down rates by tbf on each side's egress (0: unlimited)."""
        ns = self.tag(i)
        short = f"{PREFIX}{os.getpid() % 100000}x{i}"  # interface names: at most 15 bytes
        link = Link(ns, f"{short}h", f"{short}n", f"10.{self.subnet}.{i}.1",
                    f"10.{self.subnet}.{i}.2")
        ip("netns", "add", ns)
        self.links.append(link)
        ip("link", "add", link.host_if, "type", "veth", "peer", "name", link.ns_if)
        ip("link", "set", link.ns_if, "netns", ns)
        ip("addr", "add", f"{link.host_ip}/30", "dev", link.host_if)
        ip("link", "set", link.host_if, "up")
        inside = ["netns", "exec", ns, "ip"]
        ip(*inside, "addr", "add", f"{link.ns_ip}/30", "dev", link.ns_if)
        ip(*inside, "link", "set", link.ns_if, "up")
        ip(*inside, "link", "set", "lo", "up")  # the node's Runtime API is on its loopback
        if up_mbit:
            tbf(link.ns_if, up_mbit, ns)
        if down_mbit:
            tbf(link.host_if, down_mbit)
        return link

    def close(self) -> None:
        """Kill every process left in the namespaces, then delete them (their veth pairs go
        with them)."""
        for link in self.links:
            remove(link.ns)
        self.links.clear()


def remove(ns: str) -> None:
    """SIGKILL what runs in ``ns`` and delete it; a namespace already gone is fine."""
    with contextlib.suppress(LinkError):
        for pid in ip("netns", "pids", ns).split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
    with contextlib.suppress(LinkError):
        ip("netns", "delete", ns)


def remove_stale() -> list[str]:
    """Delete this testbed's namespaces whose creating process is gone (a killed test run)."""
    gone = []
    for line in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                               check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        parts = name.split("-")
        if len(parts) == 3 and parts[0] == PREFIX and parts[1].isdigit() \
                and not os.path.exists(f"/proc/{parts[1]}"):
            remove(name)
            gone.append(name)
    return gone
