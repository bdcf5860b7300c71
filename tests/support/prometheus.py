"""A real Prometheus server of a test's own: scrapes the given targets every second, loads the
given rule files, answers PromQL through its HTTP API.

Debian's ``prometheus`` package provides the binary (``scripts/ensure-promtool.sh``, run by
``make test``, installs it); a missing binary skips locally and fails under CI=true.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tests.support.kafka import free_port
from tests.support.services import binary


def prometheus_binary() -> str:
    return binary("prometheus", "run scripts/ensure-promtool.sh (make test does)")


class Prometheus:
    """``jobs``: job name -> ``host:port`` targets. Scrape and rule evaluation every second."""

    def __init__(
        self,
        workdir: Path,
        jobs: Mapping[str, Sequence[str]],
        rule_files: Sequence[Path] = (),
    ) -> None:
        self.binary = prometheus_binary()
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {
                "scrape_interval": "1s",
                "scrape_timeout": "1s",
                "evaluation_interval": "1s",
            },
            "rule_files": [str(path) for path in rule_files],
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": list(targets)}]}
                for job, targets in jobs.items()
            ],
        }
        workdir.mkdir(parents=True, exist_ok=True)
        self.config = workdir / "prometheus.yml"
        self.config.write_text(json.dumps(config, indent=2))  # JSON is YAML
        self.log = workdir / "prometheus.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> Prometheus:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [
                    self.binary,
                    f"--config.file={self.config}",
                    f"--storage.tsdb.path={self.workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                ],
                stdout=out,
                stderr=out,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited: {self.log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as response:
                    if response.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"prometheus not ready after {timeout}s: {self.log.read_text()}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def _get(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=5) as response:
            body = json.loads(response.read().decode())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[tuple[dict[str, str], float]]:
        """An instant query: each series' labels and value."""
        data = self._get("/api/v1/query", query=expr)
        assert data["resultType"] == "vector", data
        return [(dict(r["metric"]), float(r["value"][1])) for r in data["result"]]

    def alerts(self) -> list[dict[str, Any]]:
        """The alerts the loaded rules hold now (pending and firing)."""
        return list(self._get("/api/v1/alerts")["alerts"])
