"""The Prometheus endpoint every streamrl process serves, and the build it reports.

``serve`` starts prometheus-client's HTTP server and registers ``role:ident``
-> ``host:port`` in the run's ``metrics:targets`` hash, and the process's ``run.host_id`` in
``metrics:hosts``, which ``launch`` turns into a file-SD scrape config. Identity (host
included) travels as scrape-target labels, not metric labels. An endpoint bound to every
interface (``metrics.host: 0.0.0.0``, for a Prometheus on another host) registers the address
its route to Redis leaves from.
"""

from __future__ import annotations

import importlib.metadata
import platform
from dataclasses import dataclass

from prometheus_client import Info, start_http_server

from streamrl.broker.client import connect_sync
from streamrl.broker.keys import Keys
from streamrl.broker.netaddr import advertised
from streamrl.configs.schema import BrokerConfig, MetricsConfig, RunConfig

BUILD = Info("streamrl_build", "What this process runs: streamrl, Python and torch versions.")


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "none"


BUILD.info(
    {
        "version": _version("streamrl"),
        "python": platform.python_version(),
        "torch": _version("torch"),
    }
)

_servers: dict[int, object] = {}


@dataclass(frozen=True)
class Endpoint:
    """What ``serve`` and ``unregister`` read: the endpoint's bind settings, the run's Redis and
    the hash its scrape targets are listed in."""

    enabled: bool
    host: str
    broker: BrokerConfig
    run_dir: str
    targets_key: str
    # run.host_id: the target's host label
    host_id: str = ""
    hosts_key: str = ""

    @classmethod
    def from_config(cls, metrics: MetricsConfig, broker: BrokerConfig, run: RunConfig) -> Endpoint:
        keys = Keys.from_config(run, broker)
        return cls(
            enabled=metrics.enabled,
            host=metrics.host,
            broker=broker,
            run_dir=run.dir,
            targets_key=keys.metrics_targets,
            host_id=run.host_id,
            hosts_key=keys.metrics_hosts,
        )


def serve(endpoint: Endpoint, role: str, ident: str, port: int = 0) -> int:
    """Serve this process's metrics on ``endpoint.host`` (port 0 = a free one); returns the port (0 if disabled)."""
    if not endpoint.enabled:
        return 0
    server, _thread = start_http_server(port, addr=endpoint.host)
    bound = server.server_address[1]
    _servers[bound] = server
    client = connect_sync(endpoint.broker, endpoint.run_dir)
    field = f"{role}:{ident}"
    try:
        # bound to every interface: registered at the address Prometheus, beside Redis, reaches
        address = advertised(
            endpoint.host, client.connection_pool.connection_kwargs.get("host", "127.0.0.1")
        )
        pipe = client.pipeline(transaction=True)
        pipe.hset(endpoint.targets_key, field, f"{address}:{bound}")
        if endpoint.hosts_key:
            pipe.hset(endpoint.hosts_key, field, endpoint.host_id)
        pipe.execute()
    finally:
        client.close()
    return bound


def unregister(endpoint: Endpoint, role: str, ident: str, port: int) -> None:
    """Remove the scrape target and stop the endpoint (clean shutdown)."""
    server = _servers.pop(port, None)
    if server is not None:
        server.shutdown()
        server.server_close()
    client = connect_sync(endpoint.broker, endpoint.run_dir)
    try:
        client.hdel(endpoint.targets_key, f"{role}:{ident}")
        if endpoint.hosts_key:
            client.hdel(endpoint.hosts_key, f"{role}:{ident}")
    finally:
        client.close()
