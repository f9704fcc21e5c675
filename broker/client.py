"""redis-py clients configured once: timeouts, jittered retries, health checks, where Redis is.

redis-py's ``redis.asyncio`` is the async face (asyncio-redis is unmaintained
since 2020 and has no stream commands); the sync client serves threads and
tools. One client per process; both pool their connections.
"""

from __future__ import annotations

import os
from pathlib import Path

import redis
import redis.asyncio
import redis.asyncio.retry
import redis.retry
from redis.backoff import ExponentialWithJitterBackoff

from streamrl.configs.errors import StreamRLError
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
    server of the run in ``run_dir`` wrote."""
    if broker.redis_url:
        return broker.redis_url
    path = url_file(run_dir)
    try:
        url = path.read_text().strip()
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


def _backoff() -> ExponentialWithJitterBackoff:
    return ExponentialWithJitterBackoff(cap=1.0, base=0.02)


def connect_async(broker: BrokerConfig, run_dir: str | os.PathLike) -> redis.asyncio.Redis:
    """Async client (bytes responses) of the Redis ``redis_url`` finds. Failed commands are
    retried ``broker.retries`` times with jittered backoff."""
    retry = redis.asyncio.retry.Retry(_backoff(), broker.retries, supported_errors=_RETRY_ON)
    return redis.asyncio.Redis.from_url(redis_url(broker, run_dir), retry=retry, **_options(broker))


def connect_sync(broker: BrokerConfig, run_dir: str | os.PathLike) -> redis.Redis:
    """Sync client with the same policy as ``connect_async``."""
    retry = redis.retry.Retry(_backoff(), broker.retries, supported_errors=_RETRY_ON)
    return redis.Redis.from_url(redis_url(broker, run_dir), retry=retry, **_options(broker))
