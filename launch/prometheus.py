"""A real Prometheus server as a child process, and its HTTP query API.

``with PrometheusServer(config_file, data_dir) as prom: prom.query("up")``.
The binary is Debian's ``prometheus`` package (``make prometheus`` installs
it); every wait is bounded and a failed start reports the server's log.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from streamrl.broker.server import free_port
from streamrl.configs.errors import StreamRLError
from streamrl.configs.runfiles import open_append

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
HTTP_TIMEOUT_S = 5.0


class PrometheusError(StreamRLError, RuntimeError):
    """Prometheus is missing, did not start, or answered a query with an error; the message says which."""


def prometheus_executable() -> str:
    path = shutil.which("prometheus")
    if path is None:
        raise PrometheusError(
            "no `prometheus` binary on PATH: run `make prometheus` (apt-get install prometheus)"
        )
    return path


class PrometheusServer:
    """Prometheus on ``127.0.0.1:port`` (0 = a free port) reading ``config_file``, storing in ``data_dir``."""

    def __init__(
        self,
        config_file: str | os.PathLike,
        data_dir: str | os.PathLike,
        port: int = 0,
        host: str = "127.0.0.1",
    ):
        self.config_file = Path(config_file)
        self.data_dir = Path(data_dir)
        self.host = host
        self.requested_port = port
        self.port = port
        self.proc: subprocess.Popen | None = None
        self.log_path = self.data_dir / "prometheus.log"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _command(self) -> list[str]:
        return [
            prometheus_executable(),
            f"--config.file={self.config_file}",
            f"--storage.tsdb.path={self.data_dir / 'tsdb'}",
            f"--web.listen-address={self.host}:{self.port}",
            "--storage.tsdb.retention.time=7d",
            "--log.level=warn",
        ]

    def start(self) -> PrometheusServer:
        if self.proc is not None and self.proc.poll() is None:
            return self
        if not self.config_file.exists():
            raise PrometheusError(f"Prometheus config {self.config_file} does not exist")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # A free port found by binding can be taken before Prometheus binds it: retry with a new one.
        for _attempt in range(1 if self.requested_port else 5):
            if not self.requested_port:
                self.port = free_port(self.host)
            # a link at the log's name is refused, not written through (configs.runfiles)
            with open_append(self.log_path, binary=True) as log:
                self.proc = subprocess.Popen(
                    self._command(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
                )
            if self._wait_ready():
                return self
        raise PrometheusError(
            f"prometheus did not start on {self.host}:{self.port}: {self._log_tail()}"
        )

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1.0) as resp:
                    if resp.status == 200:
                        return True
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                # not listening yet, or 503 while the TSDB opens
                pass
            time.sleep(0.1)
        self.stop()
        raise PrometheusError(
            f"prometheus on port {self.port} not ready within {START_TIMEOUT_S:.0f} s: {self._log_tail()}"
        )

    def _log_tail(self) -> str:
        text = self.log_path.read_text(errors="replace")[-1500:] if self.log_path.exists() else ""
        return text.strip() or "(no log output)"

    def api(self, path: str, **params: str) -> dict | list:
        """GET ``/api/v1/<path>``; returns ``data`` or raises PrometheusError with Prometheus' own message."""
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as resp:
                body = json.load(resp)
        # 400/422 carry a JSON error body
        except urllib.error.HTTPError as exc:
            try:
                body = json.load(exc)
            except ValueError:
                raise PrometheusError(f"{path}: HTTP {exc.code}") from None
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            raise PrometheusError(f"{path}: Prometheus at {self.url} unreachable: {exc}") from None
        if body.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        """Instant query; returns the result vector (``[{"metric": {...}, "value": [t, "v"]}, ...]``)."""
        data = self.api("query", query=expr)
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        return data["result"]

    def targets(self) -> list[dict]:
        """Active scrape targets with their labels, health and last error."""
        return self.api("targets", state="active")["activeTargets"]

    def stop(self) -> None:
        """SIGTERM (Prometheus flushes its head block), then SIGKILL after STOP_TIMEOUT_S."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(STOP_TIMEOUT_S)
        self.proc = None

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
