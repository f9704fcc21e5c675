"""Scrape config from Redis, and a real Prometheus that follows it (launch.scrape, launch.prometheus, launch.dashboard)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from streamrl.broker.client import connect_sync
from streamrl.broker.keys import Keys
from streamrl.broker.server import free_port
from streamrl.launch.prometheus import PrometheusError, PrometheusServer
from streamrl.launch.scrape import TARGETS_FILE, sync_targets, write_prometheus_config

ROOT = Path(__file__).resolve().parent.parent


class Endpoint:
    """A real prometheus-client HTTP endpoint with one gauge, standing in for a streamrl process's /metrics."""

    def __init__(self, value: float):
        self.registry = CollectorRegistry()
        Gauge("scrape_test_value", "test gauge", registry=self.registry).set(value)
        self.server, _ = start_http_server(0, addr="127.0.0.1", registry=self.registry)
        self.port = self.server.server_address[1]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def endpoints():
    made: list[Endpoint] = []

    def make(value: float) -> Endpoint:
        made.append(Endpoint(value))
        return made[-1]

    yield make
    for endpoint in made:
        endpoint.close()


@pytest.fixture
def redis_client(redis_cfg):
    client = connect_sync(redis_cfg.broker, redis_cfg.run.dir)
    yield client
    client.close()


def register(cfg, client, field: str, address: str) -> None:
    client.hset(Keys.from_config(cfg.run, cfg.broker).metrics_targets, field, address)


def wait_for(predicate, timeout: float, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return predicate()


def test_sync_targets_lists_live_endpoints_with_identity_labels_and_drops_dead_or_malformed_ones(
    redis_cfg, redis_client, endpoints, tmp_path
):
    learner, actor = endpoints(1.0), endpoints(2.0)
    register(redis_cfg, redis_client, "learner:0", f"127.0.0.1:{learner.port}")
    register(redis_cfg, redis_client, "actor:a7", f"127.0.0.1:{actor.port}")
    register(redis_cfg, redis_client, "actor:gone", f"127.0.0.1:{free_port()}")
    register(redis_cfg, redis_client, "no-ident", f"127.0.0.1:{actor.port}")
    register(redis_cfg, redis_client, "actor:badport", "127.0.0.1:notaport")

    groups = sync_targets(Keys.from_config(redis_cfg.run, redis_cfg.broker), redis_client, tmp_path)

    run = redis_cfg.run.name
    assert groups == [
        {
            "targets": [f"127.0.0.1:{actor.port}"],
            "labels": {"run": run, "role": "actor", "ident": "a7", "actor": "a7"},
        },
        {
            "targets": [f"127.0.0.1:{learner.port}"],
            "labels": {"run": run, "role": "learner", "ident": "0"},
        },
    ]
    assert json.loads((tmp_path / TARGETS_FILE).read_text()) == groups
    assert sorted(p.name for p in tmp_path.iterdir()) == [TARGETS_FILE], (
        "temp files of the atomic write are left behind"
    )
    # Dead targets are only left out of the file: a restarting process keeps its registration.
    assert redis_client.hlen(Keys.from_config(redis_cfg.run, redis_cfg.broker).metrics_targets) == 5


def test_prometheus_config_points_file_sd_at_the_targets_file_and_scrapes_every_2s(tmp_path):
    path = write_prometheus_config(tmp_path / "prom")
    config = yaml.safe_load(path.read_text())
    job = config["scrape_configs"][0]
    assert job["scrape_interval"] == "2s"
    assert job["file_sd_configs"] == [
        {"files": [str((tmp_path / "prom" / TARGETS_FILE).resolve())], "refresh_interval": "2s"}
    ]
    assert json.loads((tmp_path / "prom" / TARGETS_FILE).read_text()) == []
    check = subprocess.run(
        ["promtool", "check", "config", str(path)], capture_output=True, text=True, timeout=30
    )
    assert check.returncode == 0, check.stdout + check.stderr


def test_prometheus_scrapes_synced_targets_with_their_labels_and_forgets_removed_ones(
    redis_cfg, redis_client, endpoints, tmp_path
):
    first, second = endpoints(11.0), endpoints(22.0)
    register(redis_cfg, redis_client, "actor:a0", f"127.0.0.1:{first.port}")
    register(redis_cfg, redis_client, "actor:a1", f"127.0.0.1:{second.port}")
    out = tmp_path / "prometheus"
    config = write_prometheus_config(out)
    sync_targets(Keys.from_config(redis_cfg.run, redis_cfg.broker), redis_client, out)

    with PrometheusServer(config, out) as prom:

        def by_actor() -> dict:
            return {
                r["metric"].get("actor"): float(r["value"][1])
                for r in prom.query("scrape_test_value")
            }

        assert wait_for(lambda: by_actor() == {"a0": 11.0, "a1": 22.0}, timeout=15), (
            by_actor(),
            prom.targets(),
        )
        labels = prom.query('scrape_test_value{actor="a1"}')[0]["metric"]
        assert (labels["role"], labels["ident"], labels["run"]) == (
            "actor",
            "a1",
            redis_cfg.run.name,
        )

        second.close()
        groups = sync_targets(Keys.from_config(redis_cfg.run, redis_cfg.broker), redis_client, out)
        assert [g["labels"]["actor"] for g in groups] == ["a0"]
        assert wait_for(
            lambda: [t["labels"]["actor"] for t in prom.targets()] == ["a0"], timeout=15
        ), prom.targets()


def test_prometheus_server_reports_bad_queries_and_missing_config(tmp_path):
    with pytest.raises(PrometheusError, match="does not exist"):
        PrometheusServer(tmp_path / "nope.yml", tmp_path).start()
    config = write_prometheus_config(tmp_path)
    with PrometheusServer(config, tmp_path) as prom:
        assert prom.query("vector(3)")[0]["value"][1] == "3"
        with pytest.raises(PrometheusError, match="parse error"):
            prom.query("rate(streamrl_x[")
    assert prom.proc is None


def test_dashboard_command_serves_prometheus_and_live_view_then_stops_on_sigterm(
    redis_cfg, redis_client, endpoints, tmp_path
):
    learner = endpoints(5.0)
    register(redis_cfg, redis_client, "learner:0", f"127.0.0.1:{learner.port}")
    port, view_port = free_port(), free_port()
    run_dir = tmp_path / "run"
    argv = [
        sys.executable,
        "-m",
        "streamrl.launch.dashboard",
        "--run-dir",
        str(run_dir),
        "--port",
        str(port),
        "--view-port",
        str(view_port),
    ]
    argv += [f"run.name={redis_cfg.run.name}", f"broker.redis_url={redis_cfg.broker.redis_url}"]
    proc = subprocess.Popen(
        argv,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        prom = PrometheusServer(
            run_dir / "prometheus" / "prometheus.yml", run_dir / "prometheus", port=port
        )

        def discovered():
            try:
                return [t["labels"].get("role") for t in prom.targets()] == ["learner"]
            # not listening yet
            except PrometheusError:
                return False

        assert wait_for(discovered, timeout=30), (
            "the dashboard's Prometheus never picked up the registered learner"
        )
        with urllib.request.urlopen(f"http://127.0.0.1:{view_port}/live.html", timeout=5) as resp:
            assert b"streamrl" in resp.read()
        with urllib.request.urlopen(
            f"http://127.0.0.1:{view_port}/streamrl.json", timeout=5
        ) as resp:
            assert json.load(resp)["uid"] == "streamrl"
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, out
    assert "prometheus stopped" in out
