"""The chaos suite's network cut (tests/loopback_proxy.py) against a plain echo server on loopback."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from tests.loopback_proxy import LoopbackProxy


@pytest.fixture
def echo() -> Iterator[tuple[int, list[socket.socket]]]:
    """An echo server; the list holds its accepted connections, so a test can close them (a peer that dies)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    accepted: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            accepted.append(conn)
            threading.Thread(target=pump, args=(conn,), daemon=True).start()

    def pump(conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := conn.recv(4096):
                conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    yield int(server.getsockname()[1]), accepted
    server.close()


def _connect(port: int) -> socket.socket:
    client = socket.create_connection(("127.0.0.1", port), timeout=2)
    client.settimeout(0.5)
    return client


def test_it_forwards_stalls_resumes_and_resets(echo: tuple[int, list[socket.socket]]) -> None:
    port, _ = echo
    proxy = LoopbackProxy(port).start()
    try:
        client = _connect(proxy.port)
        client.sendall(b"one")
        assert client.recv(16) == b"one"
        proxy.stall()
        client.sendall(b"two")
        with pytest.raises(TimeoutError):  # nothing flows while stalled, on open connections...
            client.recv(16)
        late = _connect(proxy.port)
        late.sendall(b"new")
        with pytest.raises(TimeoutError):  # ...nor on new ones
            late.recv(16)
        proxy.resume()
        client.settimeout(2)
        late.settimeout(2)
        assert client.recv(16) == b"two" and late.recv(16) == b"new"  # held bytes flow, nothing lost
        assert proxy.open_connections == 2
        proxy.reset()
        with pytest.raises(OSError):  # the peer sees its connection dropped
            client.sendall(b"x" * 100_000)
            client.recv(16)
        assert proxy.open_connections == 0
        fresh = _connect(proxy.port)
        fresh.sendall(b"again")
        assert fresh.recv(16) == b"again"
    finally:
        proxy.close()


def test_when_the_server_side_dies_the_client_side_is_closed(echo: tuple[int, list[socket.socket]]) -> None:
    """No half-open connection is left: a killed broker's port must be free for its restart."""
    port, accepted = echo
    proxy = LoopbackProxy(port).start()
    try:
        client = _connect(proxy.port)
        client.sendall(b"hi")
        assert client.recv(16) == b"hi"
        accepted[0].shutdown(socket.SHUT_RDWR)  # as the kernel does for a process that was killed
        client.settimeout(2)
        assert client.recv(16) == b""
        deadline = time.monotonic() + 2  # and the proxy let go of both sides without waiting for the client
        while proxy.open_connections and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proxy.open_connections == 0
        client.close()
    finally:
        proxy.close()
