"""fedinit/cli/deploy_local.py's TLS + node-auth deployment with each SuperNode behind a device
link: its own network namespace, a veth pair rate-limited by tbf, and a fault proxy in the root
namespace on the veth's host address that forwards to the SuperLink's Fleet API.

Only the Fleet API crosses the link (as on a device); the CLI and the ServerApp reach the
SuperLink on 127.0.0.1. The SuperLink's certificate also names each proxy address (a
``--san`` per link), so the node verifies it as it would a real one. ``stop()`` ends the
processes, then the proxies, then the namespaces (also when ``up()`` failed half-way)."""

from __future__ import annotations

import contextlib
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from fedinit.cli.deploy_local import MAKE_CERTS, Deployment, Proc
from testbeds.fault_proxy import FaultProxy, ProxyThread
from testbeds.link_scenarios import LOOPBACK, Scenario
from testbeds.links import Link, Namespaces, remove_stale

PROXY_PORT_OFFSET = 5
"""Each proxy listens on its link's host address, port base + 5 (a port of the
deployment's own range; the addresses differ per node)."""


@dataclass
class LinkDeployment(Deployment):
    """``Deployment`` whose node i is behind ``scenarios[i]`` (LOOPBACK: as before, no
    namespace, no proxy)."""

    scenarios: list[Scenario] = field(default_factory=list)
    subnet: int = 201
    links: dict[int, Link] = field(default_factory=dict)
    proxies: dict[int, FaultProxy] = field(default_factory=dict)
    _nets: Namespaces | None = None
    _proxy_thread: ProxyThread | None = None

    def scenario(self, i: int) -> Scenario:
        return self.scenarios[i] if i < len(self.scenarios) else LOOPBACK

    @property
    def proxy_port(self) -> int:
        return self.base_port + PROXY_PORT_OFFSET

    def make_links(self) -> None:
        """A namespace, veth pair and proxy per node whose scenario is not LOOPBACK."""
        remove_stale()
        self._nets = Namespaces(self.subnet)
        self._proxy_thread = ProxyThread()
        host, port = self.fleet_address.rsplit(":", 1)
        for i in range(self.num_nodes):
            sc = self.scenario(i)
            if sc == LOOPBACK:
                continue
            link = self._nets.add(i, sc.up_mbit, sc.down_mbit)
            self.links[i] = link
            self.proxies[i] = self._proxy_thread.add((link.host_ip, self.proxy_port),
                                                     (host, int(port)), sc.faults(), seed=i)

    def prepare(self) -> None:
        super().prepare()
        if not self.insecure and self.links:  # the server certificate names each proxy
            sans = [a for link in self.links.values() for a in ("--san", f"IP:{link.host_ip}")]
            subprocess.run(["bash", str(MAKE_CERTS), *sans, str(self.certs)], check=True,
                           stdout=subprocess.DEVNULL)

    def up(self, start: list[int] | None = None) -> None:
        self.make_links()
        super().up(start)

    def node_command(self, i: int, key: Path | None = None, root_ca: Path | None = None,
                     no_ca: bool = False, extra: list[str] | None = None) -> list[str]:
        """Deployment's command, run in node i's namespace against its proxy."""
        cmd = super().node_command(i, key, root_ca, no_ca, extra)
        link = self.links.get(i)
        if link is None:
            return cmd
        cmd[cmd.index("--superlink") + 1] = f"{link.host_ip}:{self.proxy_port}"
        return [*link.exec_prefix(), *cmd]

    def cut(self, i: int, seconds: float) -> None:
        """Node i's link gone for ``seconds`` from now."""
        assert self._proxy_thread is not None
        self._proxy_thread.cut(self.proxies[i], seconds)

    def wire_bytes(self) -> tuple[int, int]:
        """(up, down) bytes through every proxy so far (TLS records, gRPC framing included)."""
        return (0, 0) if self._proxy_thread is None else self._proxy_thread.totals()

    def node_proc(self, i: int) -> Proc:
        return next(p for p in self.procs if p.name == f"supernode-{i}")

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            if self._proxy_thread is not None:
                with contextlib.suppress(Exception):
                    self._proxy_thread.close()
                self._proxy_thread = None
            if self._nets is not None:
                self._nets.close()
                self._nets = None
            self.links.clear()
            self.proxies.clear()
