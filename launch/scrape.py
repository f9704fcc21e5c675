"""Prometheus scrape config of a run: file-based service discovery from Redis.

Every process registers ``role:ident -> host:port`` in ``metrics:targets``
(``runtime.metrics_endpoint.serve``). ``sync_targets`` turns that hash into the file-SD
JSON Prometheus re-reads every 2 s, so actors added or removed while a run
goes on are scraped without a reload. Process identity travels as target
labels (role, ident, actor, run, and host: the ``run.host_id`` each process registers in
``metrics:hosts``), never as metric labels. Processes on every host of a run register in the
one Redis, so the one Prometheus beside it scrapes them all: those on other hosts must bind
``metrics.host`` to an address it reaches (``0.0.0.0`` registers the address of the route to
Redis; ``runtime.metrics_endpoint``).

A target whose endpoint refuses a TCP connect is left out of the file but
kept in Redis: a process that is restarting registers again under the same
field, and a transient failure must not lose a target for good.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from streamrl.broker.client import as_str
from streamrl.broker.keys import Keys
from streamrl.configs.runfiles import write_new

TARGETS_FILE = "targets.json"
CONFIG_FILE = "prometheus.yml"
SCRAPE_INTERVAL = "2s"
CONNECT_TIMEOUT_S = 0.5
JOB = "streamrl"

log = logging.getLogger(__name__)


def prometheus_dir(run_dir: str | os.PathLike) -> Path:
    """Where a run keeps its scrape config: ``<run.dir>/prometheus``."""
    return Path(run_dir) / "prometheus"


def parse_target(field: str, address: str) -> tuple[str, str, str, int] | None:
    """``("actor:a0", "127.0.0.1:9001")`` -> ``("actor", "a0", "127.0.0.1", 9001)``; None (logged) if malformed."""
    role, sep, ident = field.partition(":")
    host, colon, port = address.rpartition(":")
    # IPv6 literals are registered as [::1]:port
    host = host.strip("[]")
    if not (sep and role and ident and colon and host and port.isdigit() and 0 < int(port) < 65536):
        log.warning(
            "ignoring malformed metrics target %r -> %r (expected role:ident -> host:port)",
            field,
            address,
        )
        return None
    return role, ident, host, int(port)


def endpoint_alive(host: str, port: int, timeout: float = CONNECT_TIMEOUT_S) -> bool:
    """A TCP connect succeeds: the process that registered the endpoint still serves it."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def target_group(
    run: str, role: str, ident: str, host: str, port: int, host_id: str | None = None
) -> dict:
    """One file-SD entry. ``actor`` repeats the ident for actors so panels can say ``by (actor)``;
    ``host`` is the ``run.host_id`` of the process, when it registered one."""
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    labels = {"run": run, "role": role, "ident": ident}
    if role == "actor":
        labels["actor"] = ident
    if host_id:
        labels["host"] = host_id
    return {"targets": [address], "labels": labels}


def live_targets(keys: Keys, redis_client) -> list[dict]:
    """Target groups of every registered endpoint that accepts a connection, sorted by role then ident."""
    registered = redis_client.hgetall(keys.metrics_targets)
    hosts = {as_str(f): as_str(h) for f, h in redis_client.hgetall(keys.metrics_hosts).items()}
    parsed = [parse_target(as_str(f), as_str(a)) for f, a in registered.items()]
    parsed = sorted(p for p in parsed if p is not None)
    if not parsed:
        return []
    # Connects run in parallel so one unreachable host costs one timeout, not one per target.
    with ThreadPoolExecutor(max_workers=min(16, len(parsed))) as pool:
        alive = list(pool.map(lambda p: endpoint_alive(p[2], p[3]), parsed))
    return [
        target_group(keys.run_name, *p, host_id=hosts.get(f"{p[0]}:{p[1]}"))
        for p, ok in zip(parsed, alive, strict=True)
        if ok
    ]


def write_atomic(path: Path, text: str) -> None:
    """Write via a temp file and rename, so Prometheus never reads a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_new(path, text)


def sync_targets(keys: Keys, redis_client, out_dir: str | os.PathLike) -> list[dict]:
    """Rewrite ``<out_dir>/targets.json`` from Redis; returns the target groups.

    The file is only replaced when its content changes, so a steady run does
    not make Prometheus re-read it every call.
    """
    path = Path(out_dir) / TARGETS_FILE
    groups = live_targets(keys, redis_client)
    text = json.dumps(groups, indent=2) + "\n"
    try:
        unchanged = path.read_text() == text
    except FileNotFoundError:
        unchanged = False
    if not unchanged:
        write_atomic(path, text)
    return groups


def prometheus_config(targets_path: str | os.PathLike) -> dict:
    """Scrape every 2 s whatever ``targets_path`` lists; the file is re-read every 2 s (and on change)."""
    return {
        "global": {
            "scrape_interval": SCRAPE_INTERVAL,
            "scrape_timeout": SCRAPE_INTERVAL,
            "evaluation_interval": SCRAPE_INTERVAL,
        },
        "scrape_configs": [
            {
                "job_name": JOB,
                "scrape_interval": SCRAPE_INTERVAL,
                "file_sd_configs": [
                    {"files": [str(targets_path)], "refresh_interval": SCRAPE_INTERVAL}
                ],
            }
        ],
    }


def write_prometheus_config(out_dir: str | os.PathLike) -> Path:
    """Write ``<out_dir>/prometheus.yml`` (and an empty targets.json if none exists yet); returns its path."""
    out_dir = Path(out_dir).resolve()
    targets = out_dir / TARGETS_FILE
    if not targets.exists():
        write_atomic(targets, "[]\n")
    path = out_dir / CONFIG_FILE
    write_atomic(path, yaml.safe_dump(prometheus_config(targets), sort_keys=False))
    return path
