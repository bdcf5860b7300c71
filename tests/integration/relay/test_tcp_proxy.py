"""The TCP proxy the outage and fault tests put between clients and brokers must itself be
transparent: a connection that stays quiet is not dropped. (Its upstream socket kept the 5 s
connect timeout, so a broker silent for 5 s between heartbeats made the proxy cut an idle
relay's connection; tests/faults/test_confirm_stall.py then saw a relay reconnecting through
the stall instead of timing out on confirms.)"""

from __future__ import annotations

import contextlib
import socket
import threading
import time

from tests.integration.relay.publishers_fixtures import TcpProxy

QUIET = 6.0  # longer than the connect timeout the proxy uses


def _echo_server() -> tuple[socket.socket, int]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            while data := conn.recv(1024):
                conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    return server, int(server.getsockname()[1])


def test_a_quiet_connection_stays_open() -> None:
    server, port = _echo_server()
    proxy = TcpProxy(("127.0.0.1", port)).start()
    try:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=QUIET + 5) as client:
            client.sendall(b"ping")
            assert client.recv(4) == b"ping"
            # Quiet on both sides for longer than the connect timeout: the condition under
            # test is the silence itself, so this wait is the test, not a synchronisation.
            time.sleep(QUIET)
            client.sendall(b"pong")
            assert client.recv(4) == b"pong"  # b"" (EOF) when the proxy dropped it
    finally:
        proxy.cut()
        with contextlib.suppress(OSError):
            server.close()
