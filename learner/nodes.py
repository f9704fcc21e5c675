"""How the learner's ranks are started: torchrun's command line for one node or several.

One node runs ``torchrun --standalone``. Several nodes meet through torchrun's c10d rendezvous at
``--rdzv-endpoint`` (a TCP store that the node holding that address serves), each node starting
its own ``learner.ranks`` ranks; the ranks then run the same ZeRO-2 engine as on one node.

Across hosts, names are not addresses: a host name may resolve to 127.0.1.1 (Debian) or to
nothing. So each node tells torchrun the address its route to the endpoint leaves from
(``--local-addr``, which becomes ``MASTER_ADDR`` when this node holds rank 0), and gloo and NCCL
the interface that holds it (``GLOO_SOCKET_IFNAME``, ``NCCL_SOCKET_IFNAME``, unless already set).
torchrun's c10d store is served by the node that holds the endpoint's address (``holds``), said
outright rather than left to torchrun's guess from the host name. A rank that dies ends the others' step with an error (its sockets close), and torchrun restarts
every node's ranks together up to ``max_restarts`` times; each then resumes from the last
checkpoint (``learner.checkpoint``).
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass

from streamrl.broker.netaddr import interface_of, route_source

IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


class NodesError(ValueError):
    """The several-node options do not fit together; the message names the option."""


@dataclass(frozen=True)
class Nodes:
    """This node's part of a learner on ``count`` nodes meeting at ``endpoint`` (``host:port``)."""

    count: int
    rank: int
    endpoint: str
    # torchrun's rendezvous id: the run's name, so two runs on one endpoint never meet
    run_id: str
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
    def endpoint_host(self) -> str:
        return self.endpoint.rpartition(":")[0].strip("[]")


def torchrun_argv(
    python: str, nproc: int, rank_argv: list[str], nodes: Nodes | None, local_addr: str | None
) -> list[str]:
    """``python -m torch.distributed.run ... -m streamrl.learner <rank_argv>``: ``nproc`` ranks
    here, on one node (``nodes`` None: standalone, no restarts, the supervisor restarts) or on
    this node of several."""
    argv = [python, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}"]
    if nodes is None:
        argv += ["--standalone", "--max-restarts=0"]
    else:
        argv += [
            f"--nnodes={nodes.count}",
            f"--node-rank={nodes.rank}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={nodes.endpoint}",
            f"--rdzv-id={nodes.run_id}",
            f"--max-restarts={nodes.max_restarts}",
        ]
        if local_addr is not None:
            argv.append(f"--local-addr={local_addr}")
        # torchrun guesses from the host name whether this node serves the endpoint's store,
        # and guesses wrong where the name resolves to 127.0.1.1: the guess waits for a store
        # nobody serves
        argv.append(f"--rdzv-conf=is_host={str(holds(nodes.endpoint_host)).lower()}")
    return argv + ["-m", "streamrl.learner", *rank_argv]


def local_address(endpoint_host: str) -> str:
    """This node's address as the others reach it: the source of its route to the endpoint."""
    try:
        return route_source(endpoint_host)
    except OSError as exc:
        raise NodesError(f"--rdzv-endpoint host {endpoint_host!r}: no route ({exc})") from None


def interface_env(address: str, env: Mapping[str, str]) -> dict[str, str]:
    """``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME`` naming the interface that holds ``address``,
    for those of them ``env`` does not set already."""
    name = interface_of(address)
    if name is None:
        return {}
    return {var: name for var in IFNAME_VARS if not env.get(var)}


def holds(address: str) -> bool:
    """Whether one of this host's interfaces holds ``address`` (a name is resolved first)."""
    try:
        resolved = socket.getaddrinfo(address, None)[0][4][0]
    except OSError:
        return False
    return interface_of(resolved) is not None
