"""The weight transports by name (``weightsync.transport``): ``shm``, ``cuda_ipc``, ``dist`` and ``none``.

What a transport is, is ``base``'s: a ``Transport`` declares its capabilities and its own
settings (``options``, the config section ``weightsync.<name>``), and makes the learner's
``Sender`` (driven by ``weightsync.publisher``) and an actor's ``Receiver`` (driven by
``weightsync.subscriber``, filling its ``Staging`` copy). Each transport is one subpackage here
holding all its wire and storage code (``none``: one module), whose ``__init__`` exports
``TRANSPORT``:

- ``shm``: POSIX shared memory on one host (the segment, its checksums and slots);
- ``cuda_ipc``: slots on the learner's GPU opened by CUDA IPC handle (its control segment is an
  shm segment);
- ``dist``: torch.distributed broadcast in buckets (group, buckets, the learner's address);
- ``none``: nothing moves.

``slot_receiver`` is the one receive loop of the transports that keep versions in slots (shm,
cuda_ipc). Importing a transport here and listing it in ``TRANSPORTS`` makes it selectable: the
config schema takes its name and its section from this registry. Callers ask a transport's
capabilities, never its name.

Importing this is cheap (no torch, numpy or vLLM; from ``configs`` only its leaf modules
``errors`` and ``section``): each transport imports its heavy code where it makes a sender or
receiver.
"""

from __future__ import annotations

from streamrl.configs.errors import StreamRLError
from streamrl.weightsync.transports import cuda_ipc, dist, none, shm
from streamrl.weightsync.transports.base import (
    Fill,
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
    "Fill",
    "Receiver",
    "Sender",
    "Staging",
    "TransferTimeout",
    "Transport",
    "UnknownTransport",
    "get",
]
