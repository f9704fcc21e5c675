"""Exposure and code-execution surface: what listens where, who may talk to Redis, what could run data.

The static scan is meaningful here because the data path has exactly two
doors for bytes from other processes: the msgpack stream entries (decoded by
``broker.wire``) and the weight tensors (raw shared memory / torch.distributed
buffers copied into preallocated tensors). Neither format can carry code, so
the only way to turn a malicious stream entry or weight message into code
execution is a deserialiser that runs code (pickle and everything built on it:
``torch.load`` without ``weights_only=True``, ``numpy.load(allow_pickle=True)``,
``marshal``, ``shelve``) or ``eval``/``exec`` on received text. Those are
visible in the source, so a scan of the data-path packages catches a
regression before it ships.
"""

from __future__ import annotations

import ast
import ipaddress
import shutil
import socket
import uuid
from pathlib import Path

import psutil
import pytest
import redis

from streamrl.broker.server import EmbeddedRedis, RedisServerError
from streamrl.configs import Config
from streamrl.runtime import metrics_endpoint

ROOT = Path(__file__).resolve().parents[1]
DATA_PATH = ("broker", "learner", "actors", "weightsync", "runtime")
PICKLING_MODULES = {
    "pickle",
    "cPickle",
    "_pickle",
    "dill",
    "cloudpickle",
    "marshal",
    "shelve",
    "joblib",
}

# (file, what) pairs that are allowed, each with the reason.
ALLOWED = {
    # The sandbox module's job is to run model-written code, inside the contained child process.
    ("actors/sandbox.py", "exec"),
    # pickle.dumps only (nothing here unpickles): the CUDA IPC handles of the vllm actor's own staged
    # tensors, in the form vLLM documents for its IPC weight-transfer backend, for its own engine's
    # workers (children of the actor process). See docs/guarantees.md.
    ("actors/engines/vllm/senders.py", "import pickle"),
}


def _keyword(call: ast.Call, name: str):
    for kw in call.keywords:
        if kw.arg == name and isinstance(kw.value, ast.Constant):
            return kw.value.value
    return None


def code_execution_sinks(source: str) -> list[tuple[int, str]]:
    """Lines that import a pickling module or call eval/exec/torch.load/np.load unsafely."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
            )
            found += [
                (node.lineno, f"import {n}") for n in names if n.split(".")[0] in PICKLING_MODULES
            ]
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id in ("eval", "exec"):
                found.append((node.lineno, func.id))
            elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
                target = f"{func.value.id}.{func.attr}"
                if target == "torch.load" and _keyword(node, "weights_only") is not True:
                    found.append((node.lineno, "torch.load without weights_only=True"))
                if target in ("np.load", "numpy.load") and _keyword(node, "allow_pickle") is True:
                    found.append((node.lineno, "numpy.load(allow_pickle=True)"))
    return found


def test_the_scan_finds_every_kind_of_code_execution_sink():
    source = (
        "import pickle\nfrom dill import loads\nimport torch, numpy as np\n"
        "torch.load(f)\ntorch.load(f, weights_only=False)\ntorch.load(f, weights_only=True)\n"
        "np.load(f, allow_pickle=True)\neval('1')\nexec('x')\nmodel.eval()\n"
    )
    assert [line for line, _ in code_execution_sinks(source)] == [1, 2, 4, 5, 7, 8, 9]


def test_nothing_on_the_data_path_unpickles_or_evaluates_data():
    found = []
    for package in DATA_PATH:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for line, what in code_execution_sinks(path.read_text()):
                if (rel, what) not in ALLOWED:
                    found.append(f"{rel}:{line}: {what}")
    assert not found, "code-execution sinks on the data path:\n" + "\n".join(found)


def test_embedded_redis_binds_loopback_by_default(tmp_path):
    cfg = Config().broker
    assert cfg.host == "127.0.0.1"
    with EmbeddedRedis(cfg, tmp_path) as server:
        listening = {
            c.laddr.ip
            for c in psutil.Process(server.proc.pid).net_connections("inet")
            if c.status == "LISTEN"
        }
    assert listening == {"127.0.0.1"}


def test_a_non_loopback_redis_needs_a_password_and_refuses_unauthenticated_commands(tmp_path):
    with pytest.raises(RedisServerError, match="without a password"):
        EmbeddedRedis(Config().broker.model_copy(update={"host": "0.0.0.0"}), tmp_path)
    cfg = Config().broker.model_copy(update={"host": "0.0.0.0", "password": "s3cret-pw"})
    with EmbeddedRedis(cfg, tmp_path) as server:
        anonymous = redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=2)
        with pytest.raises(redis.AuthenticationError):
            anonymous.set("streamrl:x", 1)
        anonymous.close()
        assert redis.Redis.from_url(server.url, socket_timeout=2).ping()


def _non_loopback_address() -> str | None:
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return a.address
    return None


def test_metrics_endpoints_listen_on_loopback_only(redis_cfg):
    assert redis_cfg.metrics.host == "127.0.0.1"
    endpoint = metrics_endpoint.Endpoint.from_config(
        redis_cfg.metrics, redis_cfg.broker, redis_cfg.run
    )
    port = metrics_endpoint.serve(endpoint, "test", "exposure")
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            pass
        address = _non_loopback_address()
        # no other interface on this host: check what the socket is bound to
        if address is None:
            server = metrics_endpoint._servers[port]
            assert server.server_address[0] == "127.0.0.1"
        else:
            with pytest.raises(OSError), socket.create_connection((address, port), timeout=2):
                pass
    finally:
        metrics_endpoint.unregister(endpoint, "test", "exposure", port)


def _answers_without_password(port: int) -> bytes:
    """What a TCP service on loopback ``port`` answers to an unauthenticated Redis PING."""
    with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
        sock.sendall(b"PING\r\n")
        try:
            return sock.recv(128)
        except TimeoutError:
            return b""


def test_the_embedded_redis_wants_the_password_and_refuses_file_and_code_commands(tmp_path):
    # Loopback is shared with every local user: no password-less Redis even there.
    cfg = Config.model_validate({"broker": {"appendonly": True}}).broker
    with EmbeddedRedis(cfg, tmp_path) as server:
        assert server.password and server.password in server.url
        assert _answers_without_password(server.port).startswith(b"-NOAUTH")
        client = redis.Redis.from_url(server.url, socket_timeout=2)
        for command in (
            "CONFIG SET dir /tmp",
            "SAVE",
            "BGSAVE",
            "MODULE LOAD /x.so",
            "DEBUG SLEEP 0",
        ):
            with pytest.raises(redis.ResponseError, match="unknown command"):
                client.execute_command(command)
        client.xadd("streamrl:aof", {"x": 1})
        client.close()
        server.kill()
        server.restart()
        client = redis.Redis.from_url(server.url, socket_timeout=2)
        assert client.xlen("streamrl:aof") == 1, (
            "the AOF (written by the server itself) still works"
        )
        client.close()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_every_listening_socket_of_a_running_system_is_loopback_and_redis_wants_the_password(
    tmp_path, demo_policy, demo_dataset
):
    from streamrl.configs import load_config
    from streamrl.launch.status import read_steps
    from streamrl.launch.supervisor import Supervisor

    config = "configs/demo_cpu.yaml"
    overrides = [
        f"run.name=exposure-{uuid.uuid4().hex[:8]}",
        f"run.dir={tmp_path / 'run'}",
        f"model.path={demo_policy}",
        f"data.path={demo_dataset}",
        "run.max_steps=1000",
        "run.max_time_s=0",
    ]
    cfg = load_config(config, overrides, env={})
    # children an earlier test of this pytest process left behind are not this system's
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    sup = Supervisor(cfg, actors=1)
    try:
        sup.start()
        assert sup.wait_until(lambda: len(read_steps(Path(cfg.run.dir))) >= 2, timeout=180)
        processes = [psutil.Process()] + [
            p for p in psutil.Process().children(recursive=True) if p.pid not in before
        ]
        listening = []
        for proc in processes:
            try:
                connections = proc.net_connections("inet")
            except psutil.NoSuchProcess:
                continue
            listening += [(proc, c) for c in connections if c.status == psutil.CONN_LISTEN]
        assert {proc.pid for proc, _ in listening} >= {sup.redis_server.proc.pid}
        exposed = [
            f"{proc.name()} {proc.pid} on {c.laddr.ip}:{c.laddr.port}"
            for proc, c in listening
            if not ipaddress.ip_address(c.laddr.ip).is_loopback
        ]
        assert not exposed, f"listening outside loopback: {exposed}"
        open_redis = [
            f"{proc.name()} {proc.pid} on port {c.laddr.port}"
            for proc, c in listening
            if b"PONG" in _answers_without_password(c.laddr.port)
        ]
        assert not open_redis, f"a Redis answers without the run's password: {open_redis}"
        url_file = Path(cfg.run.dir) / "redis.url"
        assert url_file.stat().st_mode & 0o777 == 0o600
        assert sup.redis_server.password in url_file.read_text()
    finally:
        sup.stop()


# Run in a network + mount namespace whose /etc/hosts maps the host name to a documentation
# address (192.0.2.2, held on its loopback device so it can be bound): what a LAN host looks like
# to gloo, on a test host whose name resolves to 127.0.0.1. Prints the listening IPv4/IPv6
# addresses of the process after the learner made its world of one.
_ONE_RANK_LEARNER = """
import socket, sys
from streamrl.learner.engine import init_distributed
init_distributed()
found = set()
for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
    for line in open(table).read().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        if state == "0A":
            raw = bytes.fromhex(local.split(":")[0])
            words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            found.add(socket.inet_ntop(family, words))
print("LISTENING", *sorted(found))
"""


def test_a_one_rank_learner_listens_on_loopback_where_the_host_name_resolves_to_the_lan(tmp_path):
    import os
    import subprocess
    import sys

    from streamrl.launch.supervisor import DIST_ENV

    unshare, ip = shutil.which("unshare"), shutil.which("ip", path="/usr/sbin:/sbin:/usr/bin")
    if not (unshare and ip):
        pytest.skip("needs unshare and ip")
    hosts = tmp_path / "hosts"
    hosts.write_text(f"192.0.2.2 {socket.gethostname()}\n")
    hosts.chmod(0o644)
    inside = (
        f"{ip} link set lo up && {ip} addr add 192.0.2.2/32 dev lo && "
        f'mount --bind {hosts} /etc/hosts && exec {sys.executable} -c "$0"'
    )
    user = [] if os.geteuid() == 0 else ["--map-root-user"]
    # a plain `python -m streamrl.learner`: no launcher's variables (an earlier test of this
    # process may have set them), no interface chosen
    env = {k: v for k, v in os.environ.items() if k not in (*DIST_ENV, "GLOO_SOCKET_IFNAME")}
    out = subprocess.run(
        [unshare, *user, "--net", "--mount", "sh", "-c", inside, _ONE_RANK_LEARNER],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=env,
    )
    if "LISTENING" not in out.stdout and "Operation not permitted" in out.stderr:
        pytest.skip(f"this host refuses the namespaces: {out.stderr[-300:]}")
    assert out.returncode == 0, out.stderr[-2000:]
    listening = out.stdout.split("LISTENING", 1)[1].split()
    exposed = [a for a in listening if not ipaddress.ip_address(a).is_loopback]
    assert not exposed, f"the one-rank learner listens on {exposed}"
