"""The embedded Redis: starts for real, refuses unsafe binds, finds its URL, stops cleanly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from streamrl.broker.client import RedisNotConfigured, connect_sync, redis_url
from streamrl.broker.keys import Keys
from streamrl.broker.server import EmbeddedRedis, RedisServerError
from streamrl.configs import Config

ROOT = Path(__file__).resolve().parents[1]


def test_non_loopback_bind_without_password_is_refused(tmp_path):
    cfg = Config.model_validate({"broker": {"host": "0.0.0.0"}}).broker
    with pytest.raises(RedisServerError, match="without a password"):
        EmbeddedRedis(cfg, tmp_path)


def test_password_server_rejects_clients_without_it_and_hides_the_password(tmp_path):
    password = 's3cret/p w"\\x'
    cfg = Config.model_validate({"broker": {"password": password}}).broker
    with EmbeddedRedis(cfg, tmp_path) as server:
        # not visible in `ps`
        assert password not in " ".join(server.proc.args)
        assert redis.Redis(host="127.0.0.1", port=server.port, password=password).ping()
        assert redis.Redis.from_url(server.url).ping()
        bare = redis.Redis(
            host="127.0.0.1", port=server.port, socket_timeout=2, retry=Retry(NoBackoff(), 0)
        )
        with pytest.raises(redis.AuthenticationError):
            bare.ping()
    assert server.proc is None


def test_redis_url_is_the_configs_then_the_run_dir_file_and_never_the_environment(
    tmp_path, monkeypatch
):
    """REDIS_URL is read once, by the config loader, into broker.redis_url; the client reads only
    the config section it is handed."""
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:2/0")
    cfg = Config.model_validate({"run": {"dir": str(tmp_path)}})
    with pytest.raises(RedisNotConfigured, match="python -m streamrl.broker"):
        redis_url(cfg.broker, cfg.run.dir)
    with EmbeddedRedis(cfg.broker, tmp_path / "redis", url_file=tmp_path / "redis.url") as server:
        assert redis_url(cfg.broker, cfg.run.dir) == server.url
        assert connect_sync(cfg.broker, cfg.run.dir).ping()
        cfg.broker.redis_url = "redis://127.0.0.1:1/0"
        assert redis_url(cfg.broker, cfg.run.dir) == "redis://127.0.0.1:1/0"
    assert not (tmp_path / "redis.url").exists()


def test_keys_are_prefixed_by_run_and_bad_names_refused():
    keys = Keys("exp-1")
    assert keys.stream == "streamrl:exp-1:rollouts"
    assert keys.dead == "streamrl:exp-1:rollouts:dead"
    assert keys.actor("a0") == "streamrl:exp-1:actor:a0"
    with pytest.raises(ValueError, match="run name"):
        Keys("has space")


def test_aof_server_keeps_data_across_restart(tmp_path):
    cfg = Config.model_validate({"broker": {"appendonly": True}}).broker
    with EmbeddedRedis(cfg, tmp_path) as server:
        client = redis.Redis.from_url(server.url)
        client.set("k", "v")
        client.close()
        server.restart()
        assert redis.Redis.from_url(server.url).get("k") == b"v"


@pytest.mark.slow
def test_python_m_broker_starts_a_real_server_and_stops_on_sigterm(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamrl.broker", f"run.dir={tmp_path}", "run.name=cli"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        assert "redis ready at redis://" in line and "@127.0.0.1:" in line, (
            line + proc.stderr.read()
        )
        url = (tmp_path / "redis.url").read_text().strip()
        password = redis.connection.parse_url(url)["password"]
        # the run's password is never printed
        assert password and password not in line
        assert redis.Redis.from_url(url, socket_timeout=2).ping()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
        assert "redis stopped" in proc.stdout.read()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                redis.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5).ping()
            except redis.ConnectionError:
                break
            time.sleep(0.05)
        else:
            pytest.fail("redis-server still answers after python -m streamrl.broker exited")
        assert not (tmp_path / "redis.url").exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_python_m_broker_with_an_unreachable_redis_url_fails_clearly(tmp_path):
    from streamrl.broker.server import free_port

    env = {**os.environ, "PYTHONPATH": str(ROOT), "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}
    out = subprocess.run(
        [sys.executable, "-m", "streamrl.broker", "broker.retries=0"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1
    assert (
        "broker: external Redis at redis://127.0.0.1:" in out.stderr
        and "Traceback" not in out.stderr
    )
