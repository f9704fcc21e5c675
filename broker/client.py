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
from streamrl.configs.schema import Config

URL_FILE = "redis.url"
_RETRY_ON = (redis.ConnectionError, redis.TimeoutError)


class RedisNotConfigured(StreamRLError, RuntimeError):
    """No Redis to talk to: neither REDIS_URL, broker.redis_url nor a running embedded server."""


def as_str(value: bytes | str) -> str:
    """A key, field or value as text: clients made without ``decode_responses`` return bytes."""
    return value.decode() if isinstance(value, bytes) else value


def url_file(cfg: Config) -> Path:
    """Where the embedded server of this run writes its URL."""
    return Path(cfg.run.dir) / URL_FILE


def redis_url(cfg: Config) -> str:
    """REDIS_URL, else ``broker.redis_url``, else the URL the run's embedded server wrote."""
    url = os.environ.get("REDIS_URL") or cfg.broker.redis_url
    if url:
        return url
    path = url_file(cfg)
    try:
        url = path.read_text().strip()
    except FileNotFoundError:
        raise RedisNotConfigured(
            f"no Redis: set REDIS_URL or broker.redis_url, or start the embedded one (python -m streamrl.broker) so it writes {path}"
        ) from None
    if not url:
        raise RedisNotConfigured(f"{path} is empty")
    return url


def _options(cfg: Config) -> dict:
    b = cfg.broker
    return {
        "socket_timeout": b.socket_timeout_s,
        "socket_connect_timeout": min(b.socket_timeout_s, 5.0),
        "health_check_interval": b.health_check_interval_s,
        "retry_on_error": list(_RETRY_ON),
    }


def _backoff() -> ExponentialWithJitterBackoff:
    return ExponentialWithJitterBackoff(cap=1.0, base=0.02)


def connect_async(cfg: Config, url: str | None = None) -> redis.asyncio.Redis:
    """Async client (bytes responses). Failed commands are retried ``broker.retries`` times with jittered backoff."""
    retry = redis.asyncio.retry.Retry(_backoff(), cfg.broker.retries, supported_errors=_RETRY_ON)
    return redis.asyncio.Redis.from_url(url or redis_url(cfg), retry=retry, **_options(cfg))


def connect_sync(cfg: Config, url: str | None = None) -> redis.Redis:
    """Sync client with the same policy as ``connect_async``."""
    retry = redis.retry.Retry(_backoff(), cfg.broker.retries, supported_errors=_RETRY_ON)
    return redis.Redis.from_url(url or redis_url(cfg), retry=retry, **_options(cfg))
