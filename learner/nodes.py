"""How the learner's ranks are started: torchrun's command line for one node or several.

One node runs ``torchrun --standalone``. Several nodes meet through torchrun's *static*
rendezvous: the node the user calls ``--node-rank 0`` serves a TCP store at ``--rdzv-endpoint``'s
port and its ranks are global ranks 0.. (rank 0 publishes weights and writes checkpoints); the
others connect to it. Static, not c10d: torch's dynamic rendezvous ``pickle.loads`` its state
from that unauthenticated store, so anyone who reaches the port runs code as the learner's user.
The store's keys live under a random id (``--rdzv-id``) that node 0 puts in the password-protected
broker (``rendezvous_id``), so they cannot be guessed from the run's name.

Across hosts, names are not addresses: node 0's own name may resolve to 127.0.1.1 there (Debian)
while the other nodes reach it on its network address. ``choose_address`` picks, from what this
host sees (``HostView``), the address the other nodes reach this node at; torchrun and the ranks
are told it (the store's address, ``MASTER_ADDR``), and gloo and NCCL the interface holding it
(``GLOO_SOCKET_IFNAME``, ``NCCL_SOCKET_IFNAME``, unless already set).

A rank that dies ends the others' step with an error (its sockets close), and each node's torchrun
restarts its ranks, up to ``max_restarts`` times; each then resumes from the last checkpoint
(``learner.checkpoint``). Static rendezvous restarts each node on its own and keeps one store, in
which the previous ranks' addresses stay: ``generation_store`` gives each incarnation of the ranks
fresh keys, so a node that restarts first waits for rank 0's next incarnation instead of dialling
the dead one's.
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta

import psutil

from streamrl.broker.client import as_str
from streamrl.broker.netaddr import toward
from streamrl.broker.server import is_loopback

IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
_GENERATION = "streamrl/generation"


class NodesError(ValueError):
    """The several-node options do not fit together; the message names the option."""


@dataclass(frozen=True)
class Nodes:
    """This node's part of a learner on ``count`` nodes meeting at ``endpoint`` (``host:port``)."""

    count: int
    rank: int
    endpoint: str
    max_restarts: int

    def __post_init__(self):
        if self.count < 1:
            raise NodesError(f"--nnodes {self.count}: at least 1")
        if not 0 <= self.rank < self.count:
            raise NodesError(f"--node-rank {self.rank}: must be in 0..{self.count - 1}")
        host, colon, port = self.endpoint.rpartition(":")
        if not (colon and host and port.isdigit() and 0 < int(port) < 65536):
            raise NodesError(f"--rdzv-endpoint {self.endpoint!r}: expected host:port")

    @property
    def host(self) -> str:
        return self.endpoint.rpartition(":")[0].strip("[]")

    @property
    def port(self) -> int:
        return int(self.endpoint.rpartition(":")[2])

    @property
    def one_host(self) -> bool:
        """The endpoint is written as loopback: every node runs on this host."""
        return is_loopback(self.host)


@dataclass(frozen=True)
class HostView:
    """What this host sees of the network: the inputs of ``choose_address``."""

    # the endpoint's host as it resolves here
    resolved: str
    # address -> name of each interface that is up
    interfaces: Mapping[str, str]
    # the source address of the route to ``resolved`` (None: no route)
    endpoint_route: str | None = None
    # the source address of the route to the broker's host (None: unknown)
    broker_route: str | None = None
    # the interfaces GLOO_SOCKET_IFNAME names (empty: unset)
    named: tuple[str, ...] = field(default=())


@dataclass(frozen=True)
class Placement:
    """Where this node is reached: ``address`` on ``interface``; ``store`` is the rendezvous
    store's address as torchrun and the ranks are told it."""

    address: str
    interface: str
    store: str


def _interface(address: str, view: HostView) -> str:
    if address in view.interfaces:
        return view.interfaces[address]
    # lo holds all of 127/8, psutil lists 127.0.0.1 only
    if is_loopback(address):
        return next((n for a, n in view.interfaces.items() if is_loopback(a)), "lo")
    raise NodesError(f"no interface of this host holds {address}")


def _reached_at(nodes: Nodes, view: HostView) -> str:
    """Node 0's address for the other hosts, where the endpoint's name resolves to loopback
    here: the source of its route to the broker, else its one routable address."""
    routable = {
        a: n
        for a, n in view.interfaces.items()
        if not is_loopback(a) and (not view.named or n in view.named)
    }
    if view.broker_route in routable:
        return view.broker_route
    if len(routable) == 1:
        return next(iter(routable))
    raise NodesError(
        f"--rdzv-endpoint {nodes.endpoint}: {nodes.host} resolves to {view.resolved} on node 0, "
        f"and of its addresses ({', '.join(sorted(routable)) or 'none'}) none is plainly the one "
        "the other nodes reach: give --rdzv-endpoint as that address, or set GLOO_SOCKET_IFNAME"
    )


def choose_address(nodes: Nodes, view: HostView) -> Placement:
    """The address the other nodes reach this node at, the interface holding it, and the store's
    address. Node 0 serves the store, so it must hold the endpoint's address; where its name
    resolves to loopback (Debian's 127.0.1.1) it is reached at ``_reached_at``'s address."""
    if nodes.rank == 0:
        if nodes.one_host:
            address = view.resolved
        elif is_loopback(view.resolved):
            address = _reached_at(nodes, view)
        elif view.resolved in view.interfaces:
            address = view.resolved
        else:
            raise NodesError(
                f"--node-rank 0 serves the rendezvous at --rdzv-endpoint {nodes.endpoint}, but "
                f"{nodes.host} is {view.resolved}, which no interface of this host holds: run "
                "--node-rank 0 on that host, or give this host's address as --rdzv-endpoint"
            )
        return Placement(address, _interface(address, view), address)
    if is_loopback(view.resolved) and not nodes.one_host:
        raise NodesError(
            f"--rdzv-endpoint {nodes.endpoint}: {nodes.host} resolves to {view.resolved} on node "
            f"{nodes.rank}, which is not node 0: give node 0's address as --rdzv-endpoint"
        )
    if view.endpoint_route is None:
        raise NodesError(f"--rdzv-endpoint {nodes.endpoint}: no route to {view.resolved}")
    route = view.endpoint_route
    return Placement(route, _interface(route, view), view.resolved)


def _up_interfaces() -> dict[str, str]:
    """address -> interface name, for the IPv4 and global IPv6 addresses of interfaces that are up."""
    stats = psutil.net_if_stats()
    found = {}
    for name, addrs in psutil.net_if_addrs().items():
        if not (name in stats and stats[name].isup):
            continue
        for addr in addrs:
            if addr.family == socket.AF_INET or (
                addr.family == socket.AF_INET6 and not addr.address.lower().startswith("fe80")
            ):
                found[addr.address] = name
    return found


def host_view(nodes: Nodes, broker_host: str | None, env: Mapping[str, str]) -> HostView:
    """What this host sees: the endpoint resolved, its interfaces, its routes."""
    try:
        resolved = socket.getaddrinfo(nodes.host, nodes.port, type=socket.SOCK_STREAM)[0][4][0]
    except OSError as exc:
        raise NodesError(f"--rdzv-endpoint {nodes.endpoint}: {nodes.host} ({exc})") from None
    named = tuple(n for n in env.get("GLOO_SOCKET_IFNAME", "").split(",") if n)
    broker_route = toward(broker_host) if broker_host else None
    return HostView(resolved, _up_interfaces(), toward(resolved), broker_route, named)


def _host_port(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def torchrun_argv(
    python: str,
    nproc: int,
    rank_argv: list[str],
    nodes: Nodes | None = None,
    placement: Placement | None = None,
    rdzv_id: str = "",
) -> list[str]:
    """``python -m streamrl.learner.torchrun ... -m streamrl.learner <rank_argv>``: ``nproc`` ranks
    here, on one node (``nodes`` None: standalone, no restarts, the supervisor restarts) or on
    this node of several (static rendezvous at ``placement.store``, keys under ``rdzv_id``)."""
    argv = [python, "-m", "streamrl.learner.torchrun", f"--nproc-per-node={nproc}"]
    if nodes is None:
        argv += ["--standalone", "--max-restarts=0"]
    else:
        argv += [
            f"--nnodes={nodes.count}",
            f"--node-rank={nodes.rank}",
            "--rdzv-backend=static",
            f"--rdzv-endpoint={_host_port(placement.store, nodes.port)}",
            f"--rdzv-id={rdzv_id}",
            f"--max-restarts={nodes.max_restarts}",
        ]
    return argv + ["-m", "streamrl.learner", *rank_argv]


def interface_env(placement: Placement, env: Mapping[str, str]) -> dict[str, str]:
    """``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME`` naming the interface this node is reached
    on, for those of them ``env`` does not set already."""
    return {var: placement.interface for var in IFNAME_VARS if not env.get(var)}


def rendezvous_id(client, key: str) -> str:
    """The run's rendezvous id, kept in Redis under ``key``: the first node to ask draws it, the
    others (and later starts of the same run) read it."""
    client.set(key, secrets.token_hex(16), nx=True)
    return as_str(client.get(key))


def exposure_warning(nodes: Nodes, placement: Placement, trusted: bool) -> str | None:
    """The start-up warning about what torch cannot protect, where the nodes meet over a network
    (not loopback) and ``learner.trusted_network`` does not say the user took care of it."""
    if trusted or nodes.count < 2 or is_loopback(placement.address):
        return None
    return (
        f"streamrl learner: WARNING: the learner's nodes meet at torch's TCPStore "
        f"(--rdzv-endpoint port {nodes.port}, on node 0) and exchange tensors over gloo/NCCL "
        "(ephemeral ports); none of them authenticates its peers and they listen on every "
        "interface. Anyone who reaches them can stall or corrupt the run: only the run's hosts "
        "may reach these ports (a private network or a firewall; docs/multihost.md, 'Addresses "
        "and ports'). Set learner.trusted_network=true once they are."
    )


def generation_store(store, rank: int, timeout: timedelta):
    """``store`` under the keys of this incarnation of the ranks. Rank 0 opens a new generation
    each time it starts; every other rank waits for a generation newer than the one its previous
    incarnation joined, since static rendezvous keeps one store whose old keys name dead ranks."""
    import torch.distributed as dist

    seen = f"streamrl/seen/{rank}"
    if rank == 0:
        generation = store.add(_GENERATION, 1)
        store.set(f"streamrl/started/{generation}", "1")
    else:
        last = int(as_str(store.get(seen))) if store.check([seen]) else 0
        store.wait([f"streamrl/started/{last + 1}"], timeout)
        generation = store.add(_GENERATION, 0)
    store.set(seen, str(generation))
    return dist.PrefixStore(f"streamrl/generation/{generation}/", store)


def several_nodes() -> bool:
    """This process is a rank of a learner on several nodes (torchrun's ``GROUP_WORLD_SIZE``)."""
    return int(os.environ.get("GROUP_WORLD_SIZE", "1")) > 1


def init_process_group(backend: str, timeout: timedelta) -> None:
    """Join the ranks of several nodes through node 0's store, under this incarnation's keys."""
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, False, timeout
    )
    dist.init_process_group(
        backend,
        store=generation_store(store, rank, timeout),
        rank=rank,
        world_size=world,
        timeout=timeout,
    )
