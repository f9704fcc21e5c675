"""Several hosts on one machine: Linux network namespaces joined by veth pairs to one bridge.

Each host is a network namespace with its own address on ``10.77.0.0/24``, its own loopback and
its own hostname (a UTS namespace per process, and ``/etc/netns/<ns>/hosts``, which
``ip netns exec`` mounts over ``/etc/hosts``, so every host resolves every other by name). The
bridge lives in a namespace of its own, so nothing touches the machine's real network, and
loopback in one host cannot reach another: nothing works by accident over 127.0.0.1. Hosts share
the filesystem and ``/dev/shm``, as nodes on a shared filesystem would, minus the shm.

Needs root and iproute2 (``ip netns``), as CI has; ``available()`` says why not otherwise.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

SUBNET = "10.77.0"
NETNS_ETC = Path("/etc/netns")
# names carry the creating pid, so a crashed run's leftovers can be told from a live run's
PREFIX = "srl"


def available() -> str | None:
    """None when namespaces can be made here, else why not (for a skip message)."""
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs as root)"
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return f"`{tool}` (iproute2/util-linux) is not installed"
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def _remove_stale() -> None:
    """Delete namespaces that a killed earlier run (pid gone) left behind."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for line in listed.splitlines():
        name = line.split()[0] if line.split() else ""
        if not name.startswith(PREFIX) or "-" not in name:
            continue
        pid = name[len(PREFIX) :].split("-")[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
            shutil.rmtree(NETNS_ETC / name, ignore_errors=True)


@dataclass
class Host:
    name: str
    address: str
    netns: str
    switch: str
    procs: list[subprocess.Popen] = field(default_factory=list)

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` as run on this host: in its namespace, under its own hostname."""
        inner = f"hostname {shlex.quote(self.name)} && exec " + shlex.join(argv)
        return ["ip", "netns", "exec", self.netns, "unshare", "--uts", "sh", "-c", inner]

    def popen(self, argv: Sequence[str], **kwargs) -> subprocess.Popen:
        proc = subprocess.Popen(self.command(argv), **kwargs)
        self.procs.append(proc)
        return proc

    def run(self, argv: Sequence[str], **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(argv), **kwargs)

    def link(self, up: bool) -> None:
        """Plug this host's cable into the bridge, or pull it (its processes keep running)."""
        _ip("-n", self.switch, "link", "set", f"v{self.name}", "up" if up else "down")

    def rx_bytes(self) -> int:
        """Bytes this host's network interface has received (the link's own counter)."""
        path = "/sys/class/net/eth0/statistics/rx_bytes"
        out = subprocess.run(
            ["ip", "netns", "exec", self.netns, "cat", path],
            check=True,
            capture_output=True,
            text=True,
        )
        return int(out.stdout)


@contextmanager
def hosts(names: Sequence[str] = ("A", "B", "C")) -> Iterator[dict[str, Host]]:
    """Hosts named ``names`` on one bridge; every process started on them is killed at exit."""
    _remove_stale()
    tag = f"{PREFIX}{os.getpid()}"
    switch = f"{tag}-sw"
    made: list[str] = []
    result: dict[str, Host] = {}
    try:
        _ip("netns", "add", switch)
        made.append(switch)
        _ip("-n", switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", switch, "link", "set", "br0", "up")
        table = "127.0.0.1 localhost\n" + "".join(
            f"{SUBNET}.{i} {name}\n" for i, name in enumerate(names, start=1)
        )
        for i, name in enumerate(names, start=1):
            netns = f"{tag}-{name}"
            _ip("netns", "add", netns)
            made.append(netns)
            (NETNS_ETC / netns).mkdir(parents=True, exist_ok=True)
            (NETNS_ETC / netns / "hosts").write_text(table)
            (NETNS_ETC / netns / "hostname").write_text(name + "\n")
            _ip(
                "link",
                "add",
                f"v{name}",
                "netns",
                switch,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                netns,
            )
            _ip("-n", switch, "link", "set", f"v{name}", "master", "br0", "up")
            _ip("-n", netns, "addr", "add", f"{SUBNET}.{i}/24", "dev", "eth0")
            _ip("-n", netns, "link", "set", "eth0", "up")
            _ip("-n", netns, "link", "set", "lo", "up")
            result[name] = Host(name, f"{SUBNET}.{i}", netns, switch)
        yield result
    finally:
        for host in result.values():
            for proc in host.procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        # any process still inside (a grandchild the kill missed) dies with its namespace's pids
        for netns in reversed(made):
            pids = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True)
            for pid in pids.stdout.split():
                subprocess.run(["kill", "-9", pid], capture_output=True)
            subprocess.run(["ip", "netns", "del", netns], capture_output=True)
            shutil.rmtree(NETNS_ETC / netns, ignore_errors=True)
