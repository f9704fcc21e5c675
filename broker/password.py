"""Where the roles of a run on several hosts get the Redis password: never the command line.

A password in argv is in every local user's ``ps``: every command refuses ``broker.password=`` as
an override (``configs.load.refuse_secrets``), and a ``--join`` URL must carry none. ``streamrl
broker``, ``streamrl run`` and every ``--join`` (``actors``, ``learner``, ``scale``) read it from
``STREAMRL_REDIS_PASSWORD``, else from ``broker.password_file``, which must be readable by its
owner only, as ``ssh`` insists of a private key. A config file's ``broker.password`` is still taken
(a file, like the password file).
"""

from __future__ import annotations

import argparse
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

from streamrl.configs.errors import StreamRLError
from streamrl.configs.schema import BrokerConfig

PASSWORD_ENV = "STREAMRL_REDIS_PASSWORD"


class PasswordError(StreamRLError, ValueError):
    """A password given where others can read it, or a password file that cannot be used."""


def read_password_file(path: str | os.PathLike) -> str:
    """The first line of ``path``, which only its owner may read or write."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise PasswordError(f"broker.password_file {path}: {exc.strerror}") from None
    with os.fdopen(fd) as f:
        mode = os.fstat(f.fileno()).st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise PasswordError(
                f"broker.password_file {path} has mode {stat.S_IMODE(mode):04o}: others may read "
                f"it; chmod 600 {path}"
            )
        password = f.readline().strip()
    if not password:
        raise PasswordError(f"broker.password_file {path}: its first line is empty")
    return password


def password(broker: BrokerConfig, env: Mapping[str, str] = os.environ) -> str | None:
    """``STREAMRL_REDIS_PASSWORD``, else ``broker.password_file``'s, else ``broker.password``."""
    if env.get(PASSWORD_ENV):
        return env[PASSWORD_ENV]
    if broker.password_file:
        return read_password_file(broker.password_file)
    return broker.password


def with_password(broker: BrokerConfig, env: Mapping[str, str] = os.environ) -> BrokerConfig:
    """``broker`` with ``password`` filled in from where ``password`` looks."""
    return broker.model_copy(update={"password": password(broker, env)})


def add_join_argument(parser: argparse.ArgumentParser) -> None:
    """``--join REDIS_URL``, as every role joining a run whose broker is on another host takes it."""
    parser.add_argument(
        "--join",
        metavar="REDIS_URL",
        help="the run's broker on another host (streamrl broker prints it); the password comes "
        f"from {PASSWORD_ENV} or broker.password_file, never this URL",
    )


def join_url(url: str, broker: BrokerConfig, env: Mapping[str, str] = os.environ) -> str:
    """The URL ``streamrl actors --join`` connects to: ``url`` (which must not carry a password:
    it came from argv) with the password from the environment or the password file."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise PasswordError(f"--join {url!r}: not a redis:// or rediss:// URL")
    if parts.password:
        raise PasswordError(
            f"--join: a password in the URL is visible to every local user (ps): drop it and "
            f"set {PASSWORD_ENV} or broker.password_file instead"
        )
    secret = password(broker, env)
    if secret is None:
        return url
    user = quote(parts.username or "", safe="")
    host = parts.netloc.rpartition("@")[2]
    netloc = f"{user}:{quote(secret, safe='')}@{host}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
