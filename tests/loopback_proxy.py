"""A TCP forwarder on 127.0.0.1 that a test can stall, resume and reset: a network cut, on loopback.

The chaos suite points one process (the watermark generator) at it instead of the broker, then cuts
that process off without touching anything else:

- `stall()`: nothing flows any more in either direction, on open connections and new ones (new
  ones are accepted by the kernel and then hang): what a partition looks like to both ends until a
  keep-alive or an operation timeout gives up. Nothing is lost or reordered: bytes already read wait.
- `resume()`: everything flows again, held bytes first (a partition that heals in time).
- `reset()`: every open connection is closed with a TCP RST at both ends (a partition that lasted
  longer than a NAT or firewall keeps its state, or a peer that restarted).

It runs its own asyncio loop in a daemon thread; the methods are safe to call from any thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

from pulsar_access.settings import PulsarSettings

_CHUNK = 65536


class LoopbackProxy:
    """Forwards 127.0.0.1:`port` (0: a free one) to 127.0.0.1:`target_port`."""

    def __init__(self, target_port: int, port: int = 0) -> None:
        self.target_port = target_port
        self._requested_port = port
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"proxy-{target_port}", daemon=True)
        self._open: asyncio.Event | None = None
        self._server: asyncio.Server | None = None
        self._connections: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self.connections_seen = 0

    # -- control, from any thread -------------------------------------------------------------------

    def start(self) -> LoopbackProxy:
        self._thread.start()
        self._call(self._start()).result(timeout=10)
        return self

    def stall(self) -> None:
        self._call(self._set_open(False)).result(timeout=10)

    def resume(self) -> None:
        self._call(self._set_open(True)).result(timeout=10)

    def reset(self) -> None:
        """Close every open connection with an RST; new connections are still forwarded (or stalled)."""
        self._call(self._reset()).result(timeout=10)

    @property
    def open_connections(self) -> int:
        return len(self._connections)

    @property
    def stalled(self) -> bool:
        return self._open is not None and not self._open.is_set()

    def close(self) -> None:
        if not self._thread.is_alive():
            return
        with contextlib.suppress(Exception):
            self._call(self._close()).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def _call(self, coroutine: Coroutine[Any, Any, None]) -> Future[None]:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    # -- the loop -----------------------------------------------------------------------------------

    async def _start(self) -> None:
        self._open = asyncio.Event()
        self._open.set()
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self._requested_port, reuse_address=True)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def _set_open(self, value: bool) -> None:
        assert self._open is not None
        if value:
            self._open.set()
        else:
            self._open.clear()

    async def _reset(self) -> None:
        for pair in list(self._connections):
            for writer in pair:
                _abort(writer)
        self._connections.clear()

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._reset()

    async def _accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        assert self._open is not None
        self.connections_seen += 1
        await self._open.wait()
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            _abort(client_writer)
            return
        pair = (client_writer, upstream_writer)
        self._connections.add(pair)
        pumps = [
            asyncio.ensure_future(self._pump(client_reader, upstream_writer)),
            asyncio.ensure_future(self._pump(upstream_reader, client_writer)),
        ]
        try:
            # one side gone (closed, reset, or a peer that died): the whole connection goes, as through a
            # router; a half-open socket would keep the dead peer's port taken (FIN_WAIT2) and its restart out
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
            self._connections.discard(pair)
            for writer in pair:
                with contextlib.suppress(Exception):
                    writer.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self._open is not None
        while True:
            await self._open.wait()
            try:
                data = await reader.read(_CHUNK)
            except OSError:
                return
            if not data:
                return
            await self._open.wait()  # bytes read just before a stall wait for the resume
            try:
                writer.write(data)
                await writer.drain()
            except OSError:
                return


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close with an RST (SO_LINGER 0), as a connection dropped by the network looks to the peer."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(Exception):
        writer.transport.abort()


@dataclass
class GeneratorLink:
    """The watermark generator's own route to the broker: its binary protocol and its admin API calls each
    through a `LoopbackProxy`, so a test cuts the generator off and nothing else.

    The broker advertises a second listener (`tests.harness.GENERATOR_LISTENER`) at the service proxy's
    port; a client with that `listener_name` is sent there by every lookup, so none of its connections
    bypass the proxy. One link serves every generator of a test run (they share the cut).
    """

    service: LoopbackProxy
    admin: LoopbackProxy
    settings: PulsarSettings
    """Where the generator connects (the proxies), with `listener_name` set."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    """Held for the length of a cut: cuts never overlap."""

    @classmethod
    def start(cls, settings: PulsarSettings, listener_port: int, listener_name: str) -> GeneratorLink:
        service = LoopbackProxy(_port_of(settings.service_url), listener_port).start()
        admin = LoopbackProxy(_port_of(settings.admin_url)).start()
        proxied = replace(
            settings, service_url=f"pulsar://127.0.0.1:{service.port}", admin_url=f"http://127.0.0.1:{admin.port}",
            listener_name=listener_name,
        )  # fmt: skip
        return cls(service, admin, proxied)

    @property
    def environment(self) -> dict[str, str]:
        """What a `broker-ext serve` process needs to take this route."""
        assert self.settings.listener_name is not None
        return {
            "PULSAR_SERVICE_URL": self.settings.service_url,
            "PULSAR_ADMIN_URL": self.settings.admin_url,
            "PULSAR_LISTENER_NAME": self.settings.listener_name,
        }

    def stall(self) -> int:
        """Stall both routes; the number of connections held (the generators' own, at that moment)."""
        self.service.stall()
        self.admin.stall()
        return self.service.open_connections + self.admin.open_connections

    def resume(self) -> None:
        self.service.resume()
        self.admin.resume()

    def reset(self) -> None:
        self.service.reset()
        self.admin.reset()

    def close(self) -> None:
        self.service.close()
        self.admin.close()


def _port_of(url: str) -> int:
    port = urlsplit(url).port
    if port is None:
        raise ValueError(f"{url} names no port")
    return port
