"""A small TCP proxy that makes a link bad on purpose: latency, chunks held back, resets,
cuts. The kernel here has no ``netem``, so the link testbed puts this on the path between a
SuperNode's namespace and the SuperLink (``testbeds/link_deployment.py``).

Each direction of each connection is a queue: a chunk read at time t is written at
``max(t + delay, the previous chunk's time)`` (TCP is ordered, so a chunk held back holds the
ones after it, as a lost segment's retransmission does); a fraction ``hold_fraction`` of the
chunks waits ``hold_seconds`` more. ``reset_every`` seconds every open connection is reset
(RST on both sides). ``cut(seconds)`` takes the link away: every open connection and every
new one is black-holed (accepted, nothing forwarded either way, as a dead radio looks to
TCP) and reset when the link comes back. The proxy runs its own event loop in a thread of
the caller, so a test drives it with plain calls (``ProxyThread``)."""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

CHUNK = 16384
"""Bytes read at a time: a chunk is what one read returned (at most this)."""


@dataclass(frozen=True)
class Faults:
    """What the proxy does to every chunk and connection (all off by default)."""

    delay: float = 0.0
    """One-way seconds added to every chunk (half the round trip the scenario names)."""
    hold_fraction: float = 0.0
    hold_seconds: float = 0.0
    reset_every: float = 0.0
    """Reset every open connection this often, seconds (0: never)."""


@dataclass
class Counters:
    """What went through, for a run's bytes per round and a test's checks."""

    bytes_up: int = 0
    bytes_down: int = 0
    chunks: int = 0
    held: int = 0
    connections: int = 0
    resets: int = 0
    cuts: int = 0
    blackholed: int = 0
    """Bytes dropped while the link was cut."""


def rst(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset (SO_LINGER 0), not a FIN: what a dropped NAT entry or a
    middlebox sends."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


@dataclass(eq=False)
class Conn:
    """One proxied connection: its two sockets' writers and its pump tasks."""

    client: asyncio.StreamWriter
    server: asyncio.StreamWriter | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def reset(self) -> None:
        for w in (self.client, self.server):
            if w is not None:
                rst(w)
        for t in self.tasks:
            t.cancel()


class FaultProxy:
    """Listens on ``listen``, forwards to ``target`` with ``faults``; runs on one loop."""

    def __init__(self, listen: tuple[str, int], target: tuple[str, int], faults: Faults,
                 seed: int = 0) -> None:
        self.listen, self.target, self.faults = listen, target, faults
        self.rng = random.Random(seed)
        self.counters = Counters()
        self.conns: set[Conn] = set()
        self.cut_until = 0.0
        self.server: asyncio.Server | None = None
        self._resetter: asyncio.Task[None] | None = None

    @property
    def is_cut(self) -> bool:
        return time.monotonic() < self.cut_until

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, *self.listen)
        if self.faults.reset_every > 0:
            self._resetter = asyncio.create_task(self._reset_loop())

    async def close(self) -> None:
        if self._resetter is not None:
            self._resetter.cancel()
        if self.server is not None:
            self.server.close()
        self.reset_all()

    def reset_all(self) -> None:
        for conn in list(self.conns):
            conn.reset()
        self.conns.clear()

    async def _reset_loop(self) -> None:
        while True:
            await asyncio.sleep(self.faults.reset_every)
            if self.conns and not self.is_cut:
                self.counters.resets += len(self.conns)
                self.reset_all()

    def cut(self, seconds: float) -> None:
        """No link for ``seconds`` from now; at its end every connection it held is reset."""
        self.cut_until = time.monotonic() + seconds
        self.counters.cuts += 1
        asyncio.get_running_loop().call_later(seconds, self._end_cut)

    def _end_cut(self) -> None:
        if not self.is_cut:
            self.reset_all()

    async def _serve(self, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:
        conn = Conn(writer)
        self.conns.add(conn)
        self.counters.connections += 1
        try:
            while self.is_cut:  # a new connection into a dead link: silence until it is back
                await asyncio.sleep(0.1)
                if conn not in self.conns:
                    return
            up_reader, conn.server = await asyncio.open_connection(*self.target)
            conn.tasks = [asyncio.create_task(self._pump(reader, conn.server, True)),
                          asyncio.create_task(self._pump(up_reader, writer, False))]
            await asyncio.wait(conn.tasks, return_when=asyncio.FIRST_COMPLETED)
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            if conn in self.conns:
                self.conns.discard(conn)
                conn.reset()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    up: bool) -> None:
        """Read chunks, stamp each with its release time, write them in order."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        sender = asyncio.create_task(self._send(queue, writer, up))
        last = 0.0
        try:
            while data := await reader.read(CHUNK):
                if self.is_cut:
                    self.counters.blackholed += len(data)
                    continue
                f = self.faults
                at = time.monotonic() + f.delay
                if f.hold_fraction and self.rng.random() < f.hold_fraction:
                    at += f.hold_seconds
                    self.counters.held += 1
                last = max(at, last)
                self.counters.chunks += 1
                queue.put_nowait((last, data))
            await queue.join()
            with contextlib.suppress(OSError, RuntimeError):
                writer.write_eof()
        finally:
            sender.cancel()

    async def _send(self, queue: asyncio.Queue[tuple[float, bytes]],
                    writer: asyncio.StreamWriter, up: bool) -> None:
        while True:
            at, data = await queue.get()
            wait = at - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if self.is_cut:
                self.counters.blackholed += len(data)
            else:
                writer.write(data)
                await writer.drain()
                if up:
                    self.counters.bytes_up += len(data)
                else:
                    self.counters.bytes_down += len(data)
            queue.task_done()


class ProxyThread:
    """Proxies on an event loop in a daemon thread; every method is a plain blocking call."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True,
                                       name="fault-proxy")
        self.thread.start()
        self.proxies: list[FaultProxy] = []

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the proxies' loop and return its result (a coroutine is awaited)."""
        async def run() -> Any:
            out = fn()
            return await out if asyncio.iscoroutine(out) else out
        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout=30)

    def add(self, listen: tuple[str, int], target: tuple[str, int], faults: Faults,
            seed: int = 0) -> FaultProxy:
        proxy = FaultProxy(listen, target, faults, seed)
        self.call(proxy.start)
        self.proxies.append(proxy)
        return proxy

    def cut(self, proxy: FaultProxy, seconds: float) -> None:
        self.call(lambda: proxy.cut(seconds))

    def totals(self) -> tuple[int, int]:
        """(bytes up, bytes down) through every proxy so far."""
        return (sum(p.counters.bytes_up for p in self.proxies),
                sum(p.counters.bytes_down for p in self.proxies))

    def close(self) -> None:
        """Close every proxy and its connections, then stop the loop and its thread."""
        for proxy in self.proxies:
            with contextlib.suppress(Exception):
                self.call(proxy.close)
        self.proxies.clear()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
