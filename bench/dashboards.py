"""Dashboards benchmark: what watching a run costs it.

Measured in one run against one embedded redis-server and one real Prometheus:
1. ``sync_targets`` (the supervisor calls it every few seconds): live endpoints
   only, and the same with as many registrations whose process is gone;
2. one scrape of a process endpoint exposing every streamrl metric (what each
   learner/actor serves every 2 s), from Python and as Prometheus measures it;
3. one refresh of the whole dashboard (every PromQL expression evaluated once)
   against an instant query of ``vector(1)`` per expression (HTTP round trips alone).
"""

from __future__ import annotations

import os
import platform
import statistics
import tempfile
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from prometheus_client import CollectorRegistry, Gauge, start_http_server

from streamrl.broker.client import connect_sync
from streamrl.broker.keys import Keys
from streamrl.broker.server import EmbeddedRedis, free_port
from streamrl.configs import Config
from streamrl.launch.panels import queries, render
from streamrl.launch.prometheus import PrometheusServer
from streamrl.launch.scrape import sync_targets, write_prometheus_config


def _median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def _endpoints(n: int) -> list:
    servers = []
    for _ in range(n):
        registry = CollectorRegistry()
        Gauge("bench_value", "bench", registry=registry).set(1)
        servers.append(start_http_server(0, addr="127.0.0.1", registry=registry)[0])
    return servers


def _close(server) -> None:
    server.shutdown()
    server.server_close()


def _all_streamrl_metrics_endpoint():
    """The default registry after importing every module that defines streamrl metrics."""
    import streamrl.actors.metrics  # noqa: F401
    import streamrl.broker.metrics  # noqa: F401
    import streamrl.learner.metrics  # noqa: F401
    import streamrl.runtime.metrics_endpoint  # noqa: F401
    import streamrl.weightsync.metrics  # noqa: F401

    return start_http_server(0, addr="127.0.0.1")[0]


def _sync_rows(keys, client, out: Path, live: int, repeats: int) -> tuple[list[str], list]:
    """``sync_targets`` over ``live`` live endpoints, then with as many gone registrations added:
    the rows, and the endpoints (left serving until the end, as the run's processes would)."""
    key = keys.metrics_targets
    endpoints = _endpoints(live)
    for i, srv in enumerate(endpoints):
        client.hset(key, f"actor:a{i}", f"127.0.0.1:{srv.server_address[1]}")
    live_ms = _median_ms(lambda: sync_targets(keys, client, out), repeats)
    for i in range(live):
        client.hset(key, f"actor:gone{i}", f"127.0.0.1:{free_port()}")
    dead_ms = _median_ms(lambda: sync_targets(keys, client, out), repeats)
    return [
        f"| `sync_targets`, {live} live endpoints | {live_ms:.1f} ms | 1.00 |",
        f"| `sync_targets`, {live} live + {live} gone | {dead_ms:.1f} ms | {dead_ms / live_ms:.2f} |",
    ], endpoints


def _prometheus_ms(out: Path, repeats: int) -> tuple[float, int, float, float]:
    """With a real Prometheus scraping the registered learner: its scrape duration (ms), the
    dashboard's expression count, and the ms of that many ``vector(1)`` queries and of one refresh."""
    with PrometheusServer(write_prometheus_config(out), out) as prom:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not prom.query(
            'count_over_time(scrape_duration_seconds{role="learner"}[1m]) >= 3'
        ):
            time.sleep(0.5)
        prom_scrape = prom.query('avg_over_time(scrape_duration_seconds{role="learner"}[1m])')
        prom_scrape_ms = 1000 * float(prom_scrape[0]["value"][1]) if prom_scrape else float("nan")
        exprs = [render(q.expr) for q in queries()]
        base_ms = _median_ms(lambda: [prom.query("vector(1)") for _ in exprs], repeats)
        dash_ms = _median_ms(lambda: [prom.query(e) for e in exprs], repeats)
    return prom_scrape_ms, len(exprs), base_ms, dash_ms


def _scrape_rows(keys, client, out: Path, repeats: int) -> tuple[list[str], object]:
    """One scrape of every streamrl metric from Python and as Prometheus measures it, and the
    dashboard's refresh against the HTTP round trips alone: the rows, and the metrics endpoint."""
    metrics_srv = _all_streamrl_metrics_endpoint()
    url = f"http://127.0.0.1:{metrics_srv.server_address[1]}/metrics"
    body = urllib.request.urlopen(url, timeout=5).read()
    scrape_ms = _median_ms(lambda: urllib.request.urlopen(url, timeout=5).read(), repeats)
    client.delete(keys.metrics_targets)
    client.hset(keys.metrics_targets, "learner:0", f"127.0.0.1:{metrics_srv.server_address[1]}")
    sync_targets(keys, client, out)
    prom_scrape_ms, n, base_ms, dash_ms = _prometheus_ms(out, repeats)
    return [
        f"| GET /metrics with every streamrl metric ({len(body) / 1024:.1f} KiB), from Python | {scrape_ms:.2f} ms | |",
        f"| the same scrape as Prometheus measures it (`scrape_duration_seconds`) | {prom_scrape_ms:.2f} ms | |",
        f"| {n} × instant `vector(1)` (HTTP round trips only) | {base_ms:.1f} ms | 1.00 |",
        f"| dashboard refresh: all {n} expressions once | {dash_ms:.1f} ms | {dash_ms / base_ms:.2f} |",
    ], metrics_srv


def run(quick: bool = False) -> str:
    live = 8 if quick else 32
    repeats = 5 if quick else 20
    tmp = Path(tempfile.mkdtemp(prefix="bench-dash-"))
    with EmbeddedRedis(Config().broker, tmp / "redis") as server:
        cfg = Config.model_validate(
            {
                "run": {"name": f"bench-{uuid.uuid4().hex[:8]}", "dir": str(tmp / "run")},
                "broker": {"redis_url": server.url},
            }
        )
        client = connect_sync(cfg.broker, cfg.run.dir)
        keys = Keys.from_config(cfg.run, cfg.broker)
        out = tmp / "prometheus"
        rows, endpoints = _sync_rows(keys, client, out, live, repeats)
        scrape_rows, metrics_srv = _scrape_rows(keys, client, out, repeats)
        # each shutdown waits out a 0.5 s poll
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(_close, [*endpoints, metrics_srv]))
        client.close()
        rows += scrape_rows

    date = time.strftime("%Y-%m-%d")
    machine = f"{os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}"
    return "\n".join(
        [
            "## Dashboards: cost of watching a run",
            "",
            f"{date}, {machine}, Prometheus 2.42 (Debian). Command: `make bench` (`python -m bench --only dashboards`{' --quick' if quick else ''}).",
            f"Medians of {repeats} repeats; ratios are against the first row of their group in this run.",
            "",
            "| measurement | time | ratio |",
            "|---|---|---|",
            *rows,
            "",
            "Registrations whose process is gone cost one refused loopback connect each, checked in",
            "parallel, so the supervisor's periodic sync stays in milliseconds. A scrape every 2 s costs",
            "each process about one `/metrics` render.",
            "",
        ]
    )


if __name__ == "__main__":
    print(run(quick=True))
