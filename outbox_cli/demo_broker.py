"""``outbox demo --broker URL``: the same S1 jobs, through ``outbox relay`` and a real broker.

After ``outbox_cli.demo`` stored the jobs, this part starts one relay process (it publishes the
run's rows to ``<queue>_<priority>`` and exits once nothing is left) and two
``outbox worker --source URL`` processes, waits for the seven jobs with a deadline, stops the
workers with SIGTERM (they exit 0), and deletes the run's queues or topics from the broker.

Every process shares the demo database: the workers find the outbox there, so undelivered
rows keep their place in the group whatever order the broker delivers in (G5). The
DSN and the broker URL reach the processes through the environment, never their command
lines, and everything printed is masked.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from typing import IO
from urllib.parse import unquote, urlsplit

from outbox import dsn as dsn_mod
from outbox.errors import OutboxError
from outbox_cli import demo_consumer

Echo = Callable[[str], None]
PRIORITIES = (1, 2)  # S1's: the demo consumer reads these two


class DemoFailed(OutboxError):
    """A demo process failed or the jobs did not finish in time (the message says which)."""


def check(broker: str, step: Echo) -> None:
    """Fail now, before anything is stored, if the broker does not answer."""
    from outbox.ops.check import check_broker

    result = check_broker(broker)
    if not result.ok:
        raise DemoFailed(f"broker: {result.detail}")
    step(f"broker {dsn_mod.mask(broker)}: {result.detail}")


def run_pipeline(
    dsn: str, broker: str, queue: str, consumer: str, step: Echo, timeout: float = 90.0
) -> None:
    """Relay + two broker workers on ``queue``; returns when the 7 jobs are done and every
    process ended. ``dsn`` is the unmasked database URL the processes connect to."""
    masked = dsn_mod.mask(broker)
    settings = {
        "OUTBOX_DSN": dsn,
        "OUTBOX_DEMO_QUEUE": queue,
        "OUTBOX_DEMO_CONSUMER": consumer,
    }
    engine = dsn_mod.make_engine(dsn)
    demo_consumer.prepare(engine)
    wanted = len(demo_consumer.read_runs(engine)) + 7  # a kept database holds earlier runs
    deadline = time.monotonic() + timeout
    started: list[subprocess.Popen[bytes]] = []
    with _logs() as (relay_log, worker_log):
        try:
            relay = subprocess.Popen(
                [
                    sys.executable, "-m", "outbox_cli", "relay", "--queue", queue,
                    "--poll-interval", "0.1", "--stop-when-idle",
                    "--time-limit", str(timeout), "--log-level", "WARNING",
                ],
                env=demo_consumer.child_env(OUTBOX_BROKER=broker, **settings),
                stdout=relay_log, stderr=subprocess.STDOUT,
            )  # fmt: skip
            started.append(relay)
            step(
                f"started `outbox relay` (pid {relay.pid}): publishes the rows to {queue}_1/_2 "
                f"on {masked}, marks them sent once confirmed, exits when none is left"
            )
            workers = []
            for _ in range(2):
                workers.append(
                    subprocess.Popen(
                        demo_consumer.worker_command(
                            "--queue", queue, "--time-limit", str(timeout)
                        ),
                        env=demo_consumer.child_env(OUTBOX_SOURCE=broker, **settings),
                        stdout=worker_log,
                        stderr=subprocess.STDOUT,
                    )
                )
                started.append(workers[-1])
            step(
                f"started two `outbox worker --source {masked}` (pids {workers[0].pid}, "
                f"{workers[1].pid}): receive, dedupe into the inbox, run the group's next by "
                "(priority, id)"
            )
            code = _wait(relay, deadline)
            if code != 0:
                raise DemoFailed(f"the relay exited with {code}:\n{_tail(relay_log)}")
            step("the relay published the 7 rows and exited 0: every outbox row is now sent")
            try:
                _wait_for(lambda: len(demo_consumer.read_runs(engine)) >= wanted, deadline, workers)
            except DemoFailed as exc:
                raise DemoFailed(f"{exc}:\n{_tail(worker_log)}") from None
            for worker in workers:
                worker.send_signal(signal.SIGTERM)
            codes = [_wait(worker, time.monotonic() + 30) for worker in workers]
            if codes != [0, 0]:
                raise DemoFailed(f"worker exit codes {codes}:\n{_tail(worker_log)}")
            step("the 7 jobs are done; SIGTERM let both workers finish cleanly: exit codes 0 0")
        except DemoFailed as exc:
            raise DemoFailed(dsn_mod.mask(str(exc))) from None
        finally:
            for process in started:
                _end(process)
            engine.dispose()
            _forget_queues(broker, queue, step)


def _wait(process: subprocess.Popen[bytes], deadline: float) -> int:
    try:
        return process.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        raise DemoFailed(f"process {process.pid} did not finish in time") from None


def _wait_for(
    done: Callable[[], bool], deadline: float, processes: Sequence[subprocess.Popen[bytes]]
) -> None:
    """Poll ``done`` until the deadline; a process that died meanwhile ends the wait."""
    while not done():
        dead = [p.returncode for p in processes if p.poll() is not None]
        if dead:
            raise DemoFailed(f"a worker exited early with {dead[0]}")
        if time.monotonic() > deadline:
            raise DemoFailed("the 7 jobs did not finish in time")
        time.sleep(0.1)


def _end(process: subprocess.Popen[bytes] | None) -> None:
    """Make sure a process the demo started is gone (only after a failure is one left)."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextlib.contextmanager
def _logs() -> Iterator[tuple[IO[bytes], IO[bytes]]]:
    """Where the processes write: shown (masked) only if something fails."""
    with tempfile.TemporaryFile() as relay_log, tempfile.TemporaryFile() as worker_log:
        yield relay_log, worker_log


def _tail(log: IO[bytes], lines: int = 20) -> str:
    log.flush()
    log.seek(0)
    text = log.read().decode("utf-8", errors="replace")
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _forget_queues(broker: str, queue: str, step: Echo) -> None:
    """Delete the run's broker queues (RabbitMQ) or topics (Kafka): the demo leaves nothing."""
    names = [f"{queue}_{p}" for p in PRIORITIES]
    try:
        if urlsplit(broker).scheme.lower().startswith("amqp"):
            import pika

            connection = pika.BlockingConnection(pika.URLParameters(broker))
            try:
                channel = connection.channel()
                for name in names:
                    channel.queue_delete(name)
            finally:
                connection.close()
        else:
            from confluent_kafka.admin import AdminClient

            servers = unquote(urlsplit(broker).netloc)
            admin = AdminClient({"bootstrap.servers": servers, "log_level": 0})
            for future in admin.delete_topics(names, operation_timeout=10).values():
                future.result(10)
    except Exception as exc:  # the demo's result stands; say what was left behind
        step(f"could not delete {', '.join(names)}: {dsn_mod.mask(str(exc))}")
        return
    step(f"deleted {', '.join(names)} from the broker: the demo leaves nothing there")
