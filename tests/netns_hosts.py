"""Several hosts on one machine that share nothing but a network and the folders named to be shared.

Each host is a network namespace with its own address on ``10.77.0.0/24``, joined to the others by
a veth pair to one bridge (in a namespace of its own, so nothing touches the machine's real
network, and loopback in one host cannot reach another), plus one mount and UTS namespace held by
an anchor process for the host's lifetime: its own hostname, its own ``/etc/hosts``, a fresh tmpfs
on ``/dev/shm`` and on ``/tmp``. Every command started on a host enters that one namespace set, so
commands on the same host share its shared memory and ``/tmp``, and no host sees another's.

Outside ``/tmp`` the hosts see the machine's filesystem (the Python install); the checkout and its
venv are seen on every host wherever they lie. A folder under ``/tmp`` (where pytest's ``tmp_path`` lives) is visible on a host only when named:
``Host.own`` (the host's private disk) or ``shared`` (one folder bind-mounted at the same path on
the hosts that share it, as an NFS mount would be); each appears at its own path. What a host
wrote elsewhere under its ``/tmp`` is read from outside through ``Host.path``.

``debian``: hosts whose own name resolves to 127.0.1.1 on themselves, as Debian and Ubuntu
write ``/etc/hosts``; every other host resolves them to their address.

Needs root, iproute2 (``ip netns``) and util-linux (``unshare``, ``nsenter``), as CI has;
``available()`` says why not otherwise.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

SUBNET = "10.77.0"
NETNS_ETC = Path("/etc/netns")
# names carry the creating pid, so a crashed run's leftovers can be told from a live run's
PREFIX = "srl"
# the fresh /tmp is built here (inside the fresh /dev/shm) before it is moved over /tmp, while the
# machine's /tmp, whose folders it binds, is still visible
STAGE = "/dev/shm/.stage-tmp"
# what every host has installed: the checkout and its venv (bound on every host even where a clone
# lies under /tmp, as CI's may)
INSTALLED = tuple({Path(__file__).resolve().parents[1], Path(sys.prefix).resolve()})


def available() -> str | None:
    """None when namespaces can be made here, else why not (for a skip message)."""
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs as root)"
    for tool in ("ip", "unshare", "nsenter"):
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


def _setup_script(name: str, binds: Sequence[Path]) -> str:
    """The anchor's shell: private mounts, fresh /dev/shm and /tmp with ``binds`` at their own
    paths, the hostname; then it waits, holding the namespaces, until its stdin closes."""
    lines = [
        "set -e",
        "mount --make-rprivate /",
        "mount -t tmpfs -o mode=1777 shm /dev/shm",
        f"mkdir {STAGE}",
        f"mount -t tmpfs -o mode=1777 tmp {STAGE}",
    ]
    for path in binds:
        if not path.is_relative_to("/tmp"):
            continue  # visible on every host anyway: the machine's own filesystem
        inside = f"{STAGE}/{path.relative_to('/tmp')}"
        lines += [f"mkdir -p {shlex.quote(inside)}", f"mount --bind {shlex.quote(str(path))} {shlex.quote(inside)}"]  # fmt: skip
    lines += [f"mount --move {STAGE} /tmp", f"rmdir {STAGE}", f"hostname {shlex.quote(name)}"]
    lines += ["echo ready", "exec cat >/dev/null"]
    return "\n".join(lines)


@dataclass
class Host:
    name: str
    address: str
    netns: str
    switch: str
    # the host's private folder (under /tmp, seen only here): its "disk"
    own: Path
    anchor: subprocess.Popen | None = None
    procs: list[subprocess.Popen] = field(default_factory=list)

    def command(self, argv: Sequence[str], cwd: str | os.PathLike | None = None) -> list[str]:
        """``argv`` as run on this host: in its network, mount and UTS namespaces, in ``cwd``."""
        wd = [f"--wdns={cwd}"] if cwd is not None else []
        ns = ["--mount", "--uts", "--net"]
        return ["nsenter", f"--target={self.anchor.pid}", *ns, *wd, "--", *argv]

    def popen(self, argv: Sequence[str], cwd=None, **kwargs) -> subprocess.Popen:
        proc = subprocess.Popen(self.command(argv, cwd), **kwargs)
        self.procs.append(proc)
        return proc

    def run(self, argv: Sequence[str], cwd=None, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(argv, cwd), **kwargs)

    def path(self, inside: str | os.PathLike) -> Path:
        """Where a path as this host sees it is read from outside (its private /tmp, /dev/shm)."""
        return Path(f"/proc/{self.anchor.pid}/root") / Path(inside).relative_to("/")

    def pids(self) -> list[int]:
        """Every process in this host's network namespace (the anchor included)."""
        out = subprocess.run(["ip", "netns", "pids", self.netns], capture_output=True, text=True)
        return [int(p) for p in out.stdout.split()]

    def link(self, up: bool) -> None:
        """Plug this host's cable into the bridge, or pull it (its processes keep running)."""
        _ip("-n", self.switch, "link", "set", f"v{self.name}", "up" if up else "down")

    def rx_bytes(self) -> int:
        """Bytes this host's network interface has received (the veth's own counter)."""
        return int(self.path("/sys/class/net/eth0/statistics/rx_bytes").read_text())


def _hosts_file(names: Sequence[str], me: str, debian: Sequence[str]) -> str:
    rows = ["127.0.0.1 localhost"]
    for i, name in enumerate(names, start=1):
        rows.append(f"{'127.0.1.1' if name == me and name in debian else f'{SUBNET}.{i}'} {name}")
    return "\n".join(rows) + "\n"


def _plug(switch: str, netns: str, name: str, address: str) -> None:
    """The host's veth pair: ``v<name>`` on the bridge, ``eth0`` with ``address`` in the host."""
    _ip("link", "add", f"v{name}", "netns", switch, "type", "veth",
        "peer", "name", "eth0", "netns", netns)  # fmt: skip
    _ip("-n", switch, "link", "set", f"v{name}", "master", "br0", "up")
    _ip("-n", netns, "addr", "add", f"{address}/24", "dev", "eth0")
    _ip("-n", netns, "link", "set", "eth0", "up")
    _ip("-n", netns, "link", "set", "lo", "up")


def _start_anchor(host: Host, binds: Sequence[Path]) -> None:
    inner = ["unshare", "--mount", "--uts", "--propagation", "private", "sh", "-c"]
    host.anchor = subprocess.Popen(
        ["ip", "netns", "exec", host.netns, *inner, _setup_script(host.name, binds)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    if host.anchor.stdout.readline().strip() != "ready":
        host.anchor.kill()
        raise RuntimeError(f"host {host.name} did not start: {host.anchor.stderr.read()}")


def _teardown(result: Mapping[str, Host], made: Sequence[str]) -> None:
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
    for host in result.values():
        if host.anchor is not None:
            host.anchor.wait()


@contextmanager
def hosts(
    root: Path,
    names: Sequence[str] = ("A", "B", "C"),
    shared: Mapping[Path, Sequence[str]] | None = None,
    debian: Sequence[str] = (),
) -> Iterator[dict[str, Host]]:
    """Hosts named ``names``, each with a private folder ``root/<name>`` (``Host.own``);
    ``shared``: folder -> the hosts that mount it (at its own path). Every process started on
    them is killed at exit."""
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
        for i, name in enumerate(names, start=1):
            netns = f"{tag}-{name}"
            _ip("netns", "add", netns)
            made.append(netns)
            (NETNS_ETC / netns).mkdir(parents=True, exist_ok=True)
            (NETNS_ETC / netns / "hosts").write_text(_hosts_file(names, name, debian))
            (NETNS_ETC / netns / "hostname").write_text(name + "\n")
            _plug(switch, netns, name, f"{SUBNET}.{i}")
            own = root / name
            own.mkdir(parents=True, exist_ok=True)
            result[name] = Host(name, f"{SUBNET}.{i}", netns, switch, own)
            binds = [*INSTALLED, own, *(p for p, on in (shared or {}).items() if name in on)]
            _start_anchor(result[name], binds)
        yield result
    finally:
        _teardown(result, made)
