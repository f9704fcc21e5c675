"""redis-py clients configured once: timeouts, jittered retries, health checks, where Redis is.

A ``rediss://`` URL is verified: the server's certificate against ``broker.tls_ca_file`` (this
host's copy of the CA, which replaces a ``?ssl_ca_certs=`` the URL carries from the broker's host)
or the system's CAs, and its name against the URL's host.

redis-py's ``redis.asyncio`` is the async face (asyncio-redis is unmaintained
since 2020 and has no stream commands); the sync client serves threads and
tools. One client per process; both pool their connections.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis
import redis.asyncio
import redis.asyncio.retry
import redis.retry
from redis.backoff import ExponentialWithJitterBackoff

from streamrl.configs.errors import ConfigError, StreamRLError
from streamrl.configs.runfiles import read_run_file
from streamrl.configs.schema import BrokerConfig

URL_FILE = "redis.url"
_RETRY_ON = (redis.ConnectionError, redis.TimeoutError)


class RedisNotConfigured(StreamRLError, RuntimeError):
    """No Redis to talk to: neither broker.redis_url (or REDIS_URL) nor a running embedded server."""


def as_str(value: bytes | str) -> str:
    """A key, field or value as text: clients made without ``decode_responses`` return bytes."""
    return value.decode() if isinstance(value, bytes) else value


def url_file(run_dir: str | os.PathLike) -> Path:
    """Where the embedded server of the run in ``run_dir`` writes its URL."""
    return Path(run_dir) / URL_FILE


def redis_url(broker: BrokerConfig, run_dir: str | os.PathLike) -> str:
    """``broker.redis_url`` (where the config loader puts REDIS_URL), else the URL the embedded
    server of the run in ``run_dir`` wrote: only from a directory no other user can change, and
    only a regular file of this user's (``configs.runfiles.read_run_file``), since a planted URL
    would point every process of the run at another's Redis."""
    if broker.redis_url:
        return broker.redis_url
    path = url_file(run_dir)
    try:
        url = read_run_file(run_dir, URL_FILE).strip()
    except ConfigError as exc:
        raise RedisNotConfigured(f"no Redis URL to trust: {exc}") from None
    except FileNotFoundError:
        raise RedisNotConfigured(
            f"no Redis: set REDIS_URL or broker.redis_url, or start the embedded one (python -m streamrl.broker) so it writes {path}"
        ) from None
    if not url:
        raise RedisNotConfigured(f"{path} is empty")
    return url


def _options(b: BrokerConfig) -> dict:
    return {
        "socket_timeout": b.socket_timeout_s,
        "socket_connect_timeout": min(b.socket_timeout_s, 5.0),
        "health_check_interval": b.health_check_interval_s,
        "retry_on_error": list(_RETRY_ON),
    }


def tls_url(url: str, broker: BrokerConfig) -> tuple[str, dict]:
    """(``url``, the TLS options a client of it takes): for ``rediss://``, the certificate
    required and its host name checked, against ``broker.tls_ca_file`` when set."""
    parts = urlsplit(url)
    if parts.scheme != "rediss":
        return url, {}
    options = {"ssl_cert_reqs": "required", "ssl_check_hostname": True}
    if broker.tls_ca_file:
        options["ssl_ca_certs"] = broker.tls_ca_file
        # a URL's options override a client's: the broker host's path must not
        query = [(k, v) for k, v in parse_qsl(parts.query) if k != "ssl_ca_certs"]
        url = urlunsplit(parts._replace(query=urlencode(query)))
    return url, options


def _client(client: type, broker: BrokerConfig, run_dir: str | os.PathLike, retry):
    url, tls = tls_url(redis_url(broker, run_dir), broker)
    return client.from_url(url, retry=retry, **_options(broker), **tls)


def _backoff() -> ExponentialWithJitterBackoff:
    return ExponentialWithJitterBackoff(cap=1.0, base=0.02)


def connect_async(broker: BrokerConfig, run_dir: str | os.PathLike) -> redis.asyncio.Redis:
    """Async client (bytes responses) of the Redis ``redis_url`` finds. Failed commands are
    retried ``broker.retries`` times with jittered backoff."""
    retry = redis.asyncio.retry.Retry(_backoff(), broker.retries, supported_errors=_RETRY_ON)
    return _client(redis.asyncio.Redis, broker, run_dir, retry)


def connect_sync(broker: BrokerConfig, run_dir: str | os.PathLike) -> redis.Redis:
    """Sync client with the same policy as ``connect_async``."""
    retry = redis.retry.Retry(_backoff(), broker.retries, supported_errors=_RETRY_ON)
    return _client(redis.Redis, broker, run_dir, retry)
