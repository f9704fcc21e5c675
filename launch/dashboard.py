"""``python -m streamrl.launch.dashboard [--run-dir runs/demo] [--port 9090]`` (``make dashboard``).

Runs a real Prometheus that scrapes every process of a run, keeps its
file-SD targets in sync with Redis while the run goes on, and serves the
browser live view (``launch/dashboards/live.html``). Grafana users import
``launch/dashboards/streamrl.json`` and point it at the printed Prometheus URL.
Stops cleanly on Ctrl-C / SIGTERM.
"""

from __future__ import annotations

import argparse
import functools
import json
import signal
import sys
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import redis

from streamrl.broker.client import RedisNotConfigured, connect_sync
from streamrl.broker.keys import Keys
from streamrl.configs import ConfigError, load_config
from streamrl.configs.runfiles import enter_run_dir, read_run_file
from streamrl.configs.schema import BrokerConfig, Config
from streamrl.launch.panels import DASHBOARD
from streamrl.launch.prometheus import PrometheusError, PrometheusServer
from streamrl.launch.rundir import RUN_FILE
from streamrl.launch.scrape import prometheus_dir, sync_targets, write_prometheus_config

SYNC_EVERY_S = 2.0


class _QuietHandler(SimpleHTTPRequestHandler):
    # one line per panel refresh would drown the console
    def log_message(self, *args) -> None:
        pass


def serve_live_view(port: int, host: str = "127.0.0.1") -> ThreadingHTTPServer:
    """Serve ``launch/dashboards/`` (live.html and the dashboard JSON it draws) from a daemon thread."""
    handler = functools.partial(_QuietHandler, directory=str(DASHBOARD.parent))
    server = ThreadingHTTPServer((host, port), handler)
    threading.Thread(target=server.serve_forever, name="live-view", daemon=True).start()
    return server


def run_config(args: argparse.Namespace) -> Config:
    """The run's config; ``--run-dir`` wins, and the run name comes from its run.json when there
    is one. The run directory is entered under the run-directory policy (``configs.runfiles``:
    ConfigError when it is not this user's alone) before anything in it is read, since the
    dashboard writes its Prometheus files there."""
    cfg = load_config(args.config, args.overrides)
    if args.run_dir:
        cfg.run.dir = args.run_dir
    enter_run_dir(cfg.run.dir, cfg.run.shared_read, dirs=("prometheus",))
    try:
        text = read_run_file(cfg.run.dir, RUN_FILE)
    except FileNotFoundError:
        return cfg
    try:
        cfg.run.name = json.loads(text)["run"]
    except (ValueError, KeyError) as exc:
        print(f"dashboard: ignoring unreadable {RUN_FILE}: {exc!r}", file=sys.stderr)
    return cfg


class TargetSync:
    """Rewrites targets.json from Redis; a run that is not (yet) up is reported once, not per tick."""

    def __init__(self, keys: Keys, broker: BrokerConfig, run_dir: str):
        self.keys = keys
        self.broker = broker
        self.run_dir = run_dir
        self.client: redis.Redis | None = None
        self.last_problem: str | None = None
        self.last_count = -1

    def tick(self) -> None:
        try:
            if self.client is None:
                self.client = connect_sync(self.broker, self.run_dir)
            groups = sync_targets(self.keys, self.client, prometheus_dir(self.run_dir))
        except (RedisNotConfigured, redis.RedisError) as exc:
            self.client = None
            self._report(f"waiting for the run's Redis: {exc}")
            return
        self._report(None)
        if len(groups) != self.last_count:
            self.last_count = len(groups)
            print(
                f"scraping {len(groups)} target(s): "
                + ", ".join(f"{g['labels']['role']}:{g['labels']['ident']}" for g in groups),
                flush=True,
            )

    def _report(self, problem: str | None) -> None:
        if problem != self.last_problem and problem is not None:
            print(f"dashboard: {problem}", file=sys.stderr, flush=True)
        self.last_problem = problem

    def close(self) -> None:
        if self.client is not None:
            self.client.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="streamrl dashboard", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--config",
        default="configs/demo_cpu.yaml",
        help="YAML preset of the run (default: the CPU demo)",
    )
    parser.add_argument("--run-dir", help="run directory (default: run.dir of the config)")
    parser.add_argument("--port", type=int, default=9090, help="Prometheus port on 127.0.0.1")
    parser.add_argument(
        "--view-port", type=int, default=9091, help="port of the browser live view (0 = off)"
    )
    parser.add_argument("overrides", nargs="*", help="dotted overrides, as given to `make run`")
    args = parser.parse_args(argv)
    try:
        cfg = run_config(args)
    except ConfigError as exc:
        print(f"streamrl dashboard: {exc}", file=sys.stderr)
        return 2

    out_dir = prometheus_dir(cfg.run.dir)
    config_file = write_prometheus_config(out_dir)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    sync = TargetSync(Keys.from_config(cfg.run, cfg.broker), cfg.broker, cfg.run.dir)
    sync.tick()
    try:
        prom = PrometheusServer(config_file, out_dir, port=args.port).start()
    except PrometheusError as exc:
        print(f"dashboard: {exc}", file=sys.stderr)
        return 1
    view = None
    try:
        print(f"Prometheus at {prom.url} (config {config_file}, log {prom.log_path})", flush=True)
        if args.view_port:
            view = serve_live_view(args.view_port)
            print(
                f"live view at http://127.0.0.1:{args.view_port}/live.html?prom={prom.url}",
                flush=True,
            )
        print(f"Grafana: import {DASHBOARD} with data source {prom.url}; Ctrl-C stops", flush=True)
        while not stop.wait(SYNC_EVERY_S):
            if prom.proc.poll() is not None:
                print(
                    f"dashboard: prometheus exited with code {prom.proc.returncode}; log {prom.log_path}",
                    file=sys.stderr,
                )
                return 1
            sync.tick()
    finally:
        if view is not None:
            view.shutdown()
        prom.stop()
        sync.close()
    print("prometheus stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
