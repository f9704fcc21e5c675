"""The embedded Redis under a local attacker without the password (issue 26, hole 2): a client that
floods commands and never reads its replies is disconnected at the output-buffer limit instead of
growing the server's memory, and a full server refuses writes with an error instead of evicting
stream data. Each attack sends a bounded amount of data."""

from __future__ import annotations

import os
import socket

import pytest
import redis

from streamrl.broker.server import DEBIAN_REDIS, EmbeddedRedis, redis_executable
from streamrl.configs import Config

# what the flood may send before the server must have cut it off: 1 MiB of output buffer is
# ~30k NOAUTH replies, ~0.4 MiB of PINGs, plus whatever the two kernels' socket buffers hold
FLOOD_BUDGET = 64 << 20


def _server(tmp_path, **broker) -> EmbeddedRedis:
    cfg = Config().broker.model_copy(update=broker)
    return EmbeddedRedis(cfg, tmp_path / "redis")


def test_a_client_flooding_without_reading_is_disconnected_at_the_output_buffer_limit(tmp_path):
    with _server(tmp_path, client_output_buffer_mb=1) as server:
        attacker = socket.create_connection(("127.0.0.1", server.port))
        chunk = b"PING\r\n" * ((64 << 10) // 6)
        sent, cut_off = 0, False
        try:
            while sent < FLOOD_BUDGET:
                try:
                    attacker.sendall(chunk)
                except (BrokenPipeError, ConnectionResetError):
                    cut_off = True
                    break
                sent += len(chunk)
        finally:
            attacker.close()
        assert cut_off, f"still connected after sending {sent} bytes of PINGs without reading"
        owner = redis.Redis.from_url(server.url)
        try:
            # the server lives on and holds no client with a big output buffer
            assert owner.ping()
            assert all(int(c["omem"]) < 1 << 20 for c in owner.client_list())
        finally:
            owner.close()


def test_a_full_server_refuses_writes_and_evicts_nothing(tmp_path):
    with _server(tmp_path, maxmemory_mb=16) as server:
        client = redis.Redis.from_url(server.url)
        try:
            value = os.urandom(1 << 20)
            written = 0
            with pytest.raises(redis.ResponseError, match="maxmemory"):
                # bounded: 16 MiB of maxmemory fills within ~16 of these
                for i in range(64):
                    client.xadd("stream", {"g": value})
                    written = i + 1
            assert 0 < written < 64
            assert client.xlen("stream") == written
            assert client.info("memory")["maxmemory_policy"] == "noeviction"
        finally:
            client.close()


def test_the_server_is_debians_patched_build_where_installed():
    """Debian's 7.0.15-1~deb12u10 carries the fixes for CVE-2025-21605 and CVE-2024-31449;
    `make run` and `make test` install it (package redis-tools)."""
    if not any(os.access(p, os.X_OK) for p in DEBIAN_REDIS):
        pytest.skip("Debian's redis-tools is not installed (make redis installs it)")
    assert redis_executable() in DEBIAN_REDIS
