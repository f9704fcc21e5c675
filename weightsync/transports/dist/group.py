"""The dist transport's group: the publisher's rendezvous store on a port of its range, a process
group outside the learner's DeepSpeed world (the only NCCL-specific lines of the transport), and
the bound on every step torch may block in."""

from __future__ import annotations

import datetime as dt
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as tdist

from streamrl.weightsync.transports.base import TransferTimeout


def resolve_backend(backend: str) -> str:
    if backend == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    return backend


def device_of(backend: str) -> torch.device:
    return (
        torch.device("cuda", torch.cuda.current_device())
        if backend == "nccl"
        else torch.device("cpu")
    )


def make_group(backend: str, store: tdist.Store, rank: int, size: int, timeout_s: float, host: str):
    """A process group outside the default world. The only NCCL-specific lines of the transport.

    gloo's pair listeners bind ``host``, this process's own address toward the others (a one-host
    run keeps every socket on loopback; across hosts, a name may not resolve to the right address).
    """
    timeout = dt.timedelta(seconds=timeout_s)
    if backend == "gloo":
        options = tdist.ProcessGroupGloo._Options()
        options._timeout = timeout
        options._devices = [tdist.ProcessGroupGloo.create_device(hostname=host)]
        return tdist.ProcessGroupGloo(store, rank, size, options)
    options = tdist.ProcessGroupNCCL.Options()
    options._timeout = timeout
    return tdist.ProcessGroupNCCL(store, rank, size, options)


class NoFreePort(OSError):
    pass


def bound_store(host: str, timeout_s: float, first_port: int = 0, ports: int = 1) -> tdist.TCPStore:
    """A master TCPStore on ``host`` only, on the first free port of ``first_port``..``+ports-1``
    (0: any free port).

    TCPStore binds every interface ([::]) on its own whatever host it is given; a socket bound
    here and handed over as ``master_listen_fd`` keeps it where ``weightsync.dist.host`` says.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    candidates = range(first_port, first_port + ports) if first_port else [0]
    errors = []
    for port in candidates:
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            # a restarted learner takes its port back while the old connections linger in TIME_WAIT
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((host, port))
            listener.listen()
        except OSError as exc:
            listener.close()
            errors.append(f"{port}: {exc.strerror}")
            continue
        port = listener.getsockname()[1]
        # The store's server owns the descriptor from here on (it does not copy it).
        fd = listener.detach()
        return tdist.TCPStore(
            host,
            port,
            is_master=True,
            wait_for_workers=False,
            timeout=dt.timedelta(seconds=timeout_s),
            master_listen_fd=fd,
        )
    raise NoFreePort(
        f"weightsync.dist.port: no free port on {host} in {candidates[0]}-{candidates[-1]} "
        f"({'; '.join(errors[:3])}); widen weightsync.dist.ports or move weightsync.dist.port"
    )


@contextmanager
def bounded(what: str, timeout_s: float) -> Iterator[None]:
    """Run a step torch bounds by ``timeout_s``; its failure after that long raises ``TransferTimeout``.

    gloo and NCCL report a timed-out collective and a lost peer alike as a ``RuntimeError`` (gloo:
    "Operation timed out!"), and the store's connect retries until its timeout: the time the
    step ran is what tells a timeout from an earlier failure.
    """
    start = time.monotonic()
    try:
        yield
    except RuntimeError as exc:
        if time.monotonic() - start >= timeout_s:
            raise TransferTimeout(f"{what}: no progress within {timeout_s:g} s ({exc})") from exc
        raise
