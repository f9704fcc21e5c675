"""The weight transports by name (``weightsync.transport``): ``shm``, ``cuda_ipc``, ``dist`` and ``none``.

A transport is one module here holding its sender (learner side, driven by
``weightsync.publisher``) and receiver (actor side, driven by
``weightsync.subscriber``) and exporting ``TRANSPORT``; listing it in
``TRANSPORTS`` and in the schema's ``weightsync.transport`` literal makes it
selectable. Callers ask a transport's capabilities (``publishes``,
``shared_memory``, ``device_ipc``), never its name.
"""

from __future__ import annotations

from streamrl.configs.errors import StreamRLError
from streamrl.weightsync.transports import cuda_ipc, dist, none, shm
from streamrl.weightsync.transports.base import (
    Receiver,
    Sender,
    Staging,
    TransferTimeout,
    Transport,
)

TRANSPORTS: dict[str, Transport] = {
    t.name: t for t in (shm.TRANSPORT, cuda_ipc.TRANSPORT, dist.TRANSPORT, none.TRANSPORT)
}


class UnknownTransport(StreamRLError, ValueError):
    pass


def get(name: str) -> Transport:
    """The transport registered as ``name``."""
    try:
        return TRANSPORTS[name]
    except KeyError:
        raise UnknownTransport(
            f"no weight transport {name!r}; known: {', '.join(TRANSPORTS)}"
        ) from None


__all__ = [
    "TRANSPORTS",
    "Receiver",
    "Sender",
    "Staging",
    "TransferTimeout",
    "Transport",
    "UnknownTransport",
    "get",
]
