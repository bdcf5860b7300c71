"""A TCP proxy the soak owns between the relays/workers and the broker, to cut the broker off.

Restarting the machine's RabbitMQ would hit every other user of it; from the clients' side a
broker restart is "every connection drops, new connections are refused for a while, then it
answers again". ``cut()`` does exactly that: it closes the listening socket (connects get
"connection refused") and every live connection (both directions), and ``resume()`` listens
again on the same port. Threads, two per connection: a soak has a dozen connections.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class Proxy:
    def __init__(self, target_host: str, target_port: int, listen_port: int = 0) -> None:
        self.target = (target_host, target_port)
        self.port = listen_port
        self.cuts = 0
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self._stopped = threading.Event()

    def start(self) -> None:
        """Listen (on a free port the first time, on the same port after a cut)."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        listener.settimeout(0.2)  # the accept loop sees a cut within 0.2 s
        self.port = int(listener.getsockname()[1])
        with self._lock:
            self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> int:
        """Refuse new connections and drop the live ones; returns how many were dropped."""
        with self._lock:
            listener, self._listener = self._listener, None
            conns, self._conns = self._conns, set()
        if listener is not None:
            listener.close()
        for conn in conns:
            _close(conn)
        self.cuts += 1
        return len(conns) // 2

    def resume(self) -> None:
        self.start()

    def stop(self) -> None:
        self._stopped.set()
        self.cut()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            with self._lock:
                if self._listener is not listener:
                    return
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed by cut()
            client.settimeout(None)
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                _close(client)  # the broker itself is down: the client sees a drop
                continue
            upstream.settimeout(None)
            with self._lock:
                if self._listener is not listener:  # cut meanwhile
                    _close(client)
                    _close(upstream)
                    continue
                self._conns.update((client, upstream))
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        # one side ended: end both, so the peer sees the drop as a real broker's client would
        with self._lock:
            self._conns.discard(src)
            self._conns.discard(dst)
        _close(src)
        _close(dst)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
