"""``streamrl broker``: Redis for the other hosts of a run, its password never on the command line.

The refusals run in-process (nothing starts); the served broker is a real ``streamrl broker``
process answering on its printed address with the password from the environment, and a real
redis-server speaking TLS only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
import redis

from streamrl.broker import password
from streamrl.broker.password import PASSWORD_ENV, PasswordError, join_url
from streamrl.broker.server import EmbeddedRedis, RedisServerError, free_port
from streamrl.configs.schema import BrokerConfig
from streamrl.launch.cli import main


def test_a_non_loopback_bind_without_a_password_is_refused_naming_where_one_comes_from(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    code = main(["broker", f"run.dir={tmp_path}", "broker.host=0.0.0.0"])
    assert code == 1
    assert "non-loopback address '0.0.0.0' without a password" in capsys.readouterr().err
    assert not (tmp_path / "redis.url").exists()


def test_a_password_on_the_command_line_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["broker", f"run.dir={tmp_path}", "broker.host=0.0.0.0", "broker.password=pw"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "visible to every local user" in err and PASSWORD_ENV in err
    assert not (tmp_path / "redis").exists()


def test_a_password_file_others_may_read_is_refused_and_one_of_0600_is_read(tmp_path):
    secret = tmp_path / "redis.pw"
    secret.write_text("s3cret\n")
    secret.chmod(0o644)
    broker = BrokerConfig(password_file=str(secret))
    with pytest.raises(PasswordError, match=r"mode 0644.*chmod 600"):
        password.password(broker, env={})
    secret.chmod(0o600)
    assert password.password(broker, env={}) == "s3cret"
    # the environment wins over the file
    assert password.password(broker, env={PASSWORD_ENV: "fromenv"}) == "fromenv"


def test_join_takes_the_password_from_the_environment_never_from_the_url():
    broker = BrokerConfig()
    with pytest.raises(PasswordError, match="password in the URL"):
        join_url("redis://:pw@10.0.0.1:6379/0", broker, env={})
    joined = join_url("redis://10.0.0.1:6379/0", broker, env={PASSWORD_ENV: "a/b@c"})
    assert joined == "redis://:a%2Fb%40c@10.0.0.1:6379/0"
    assert redis.connection.parse_url(joined)["password"] == "a/b@c"
    with pytest.raises(PasswordError, match="not a redis"):
        join_url("http://10.0.0.1:6379", broker, env={})


def test_the_broker_serves_with_the_environments_password_and_prints_the_join_url(tmp_path):
    env = {**os.environ, PASSWORD_ENV: "pw-from-env"}
    env.pop("REDIS_URL", None)
    proc = subprocess.Popen(
        # a free port: 6379, the default, may be another test's
        [sys.executable, "-m", "streamrl", "broker", f"run.dir={tmp_path}", "broker.port=0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        ready = proc.stdout.readline()
        hint = proc.stdout.readline()
        assert "pw-from-env" not in ready + hint, "the password is printed"
        join = hint.split("--join ")[1].split()[0]
        assert join.startswith("redis://127.0.0.1:") and "@" not in join
        client = redis.Redis.from_url(join_url(join, BrokerConfig(), env=env))
        assert client.ping()
        client.close()
        with pytest.raises(redis.AuthenticationError):
            redis.Redis.from_url(join_url(join, BrokerConfig(), env={PASSWORD_ENV: "no"})).ping()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0, proc.stderr.read()
        proc.stdout.close()
        proc.stderr.close()


def _certificate(tmp_path) -> tuple[str, str]:
    cert, key = tmp_path / "redis.crt", tmp_path / "redis.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
        + ["-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"]
        + ["-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    return str(cert), str(key)


def test_with_a_certificate_the_broker_speaks_tls_only(tmp_path):
    cert, key = _certificate(tmp_path)
    with pytest.raises(RedisServerError, match="tls_cert_file and broker.tls_key_file"):
        EmbeddedRedis(BrokerConfig(tls_cert_file=cert), tmp_path / "half")
    port = free_port()
    tls = BrokerConfig(port=port, tls_cert_file=cert, tls_key_file=key, tls_ca_file=cert)
    with EmbeddedRedis(tls, tmp_path / "redis") as server:
        assert server.url.startswith("rediss://")
        client = redis.Redis.from_url(server.url, socket_timeout=5)
        assert client.ping()
        client.close()
        plain = redis.Redis.from_url(
            server.url.replace("rediss://", "redis://").split("?")[0], socket_timeout=2
        )
        with pytest.raises(redis.ConnectionError):
            plain.ping()
        plain.close()
