"""What a weight transport is: a sender on learner rank 0 that moves one version to the actors, and a
receiver on each actor that fills the subscriber's staging copy from it.

The publisher and subscriber own versions, announcements and the staging copy; a transport owns
only how the bytes travel, and says through its capabilities what its callers need to know
(``publishes``, ``shared_memory``, ``device_ipc``) so no caller compares transport names.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar, Protocol

from streamrl.configs.errors import StreamRLError

if TYPE_CHECKING:
    import redis
    import torch

    from streamrl.broker.keys import Keys
    from streamrl.configs.schema import WeightSyncConfig
    from streamrl.weightsync.announce import Announcement
    from streamrl.weightsync.layout import Layout


class TransferTimeout(StreamRLError, TimeoutError):
    """A transfer step ran out its ``weightsync.timeout_s`` (as opposed to failing sooner, e.g. a lost peer)."""


class Sender(Protocol):
    def send(
        self,
        version: int,
        tensors: dict[str, torch.Tensor],
        aliases: dict[str, str],
        checksums: dict[str, int] | None = None,
    ) -> dict:
        """Move one version (tensors by published name, already in the transfer dtype); returns what
        the announcement's metadata adds so receivers find it. ``checksums``: the tensors' shm
        checksums when the publisher already took them (on a GPU), for a transport that stores them."""
        ...

    def close(self) -> None: ...


class Staging(Protocol):
    """The subscriber's side a receiver works against (``weightsync.subscriber.Subscriber``)."""

    @property
    def announced(self) -> Announcement | None:
        """The newest announcement read so far."""
        ...

    @property
    def version(self) -> int:
        """The version of the engine's live weights."""
        ...

    @property
    def pairs(self) -> list[tuple[str, str]]:
        """(engine name, published name) of every staged tensor, set by ``begin_fill``."""
        ...

    def reread(self) -> None:
        """Read the announcement again (a newer version may replace the one being received)."""
        ...

    def wanted(self, ann: Announcement | None) -> bool:
        """Whether ``ann`` is a version to receive: newer than the live and staged ones, not skipped."""
        ...

    def skip(self, ann: Announcement) -> None:
        """Never try ``ann``'s version again (a newer one is received)."""
        ...

    def begin_fill(
        self, layout: Layout, aliases: dict[str, str], wait_s: float = 0.0, flat: bool = False
    ) -> dict[str, torch.Tensor] | None:
        """Claim the staging copy (by engine name) for writing; None while the engine holds it.
        ``flat``: as views of one buffer in ``layout`` where it can be (``flat``)."""
        ...

    @property
    def flat(self) -> torch.Tensor | None:
        """The staging copy as one buffer in the published layout, or None (tensors alone)."""
        ...

    def end_fill(self, version: int | None, publisher: str | None) -> None:
        """Release the copy ``begin_fill`` claimed: staged as ``version``, or empty if None."""
        ...

    def received(self, seconds: float) -> None:
        """A version was staged in ``seconds``."""
        ...

    def fail(self, reason: str, detail: str = "") -> None:
        """Count a failed transfer under ``reason`` (the failures metric's label)."""
        ...


class Receiver(Protocol):
    def step(self, staging: Staging) -> float:
        """One turn of the subscriber's background thread: receive the newest wanted version into
        ``staging``; returns how long to wait for the next announcement (0: step again at once)."""
        ...

    def close(self) -> None: ...


class Transport(ABC):
    """One way weights travel, registered by ``name`` in ``weightsync.transports``."""

    name: ClassVar[str]
    # False: the learner publishes nothing and actors keep the weights they loaded
    publishes: ClassVar[bool] = True
    # a version lies in a shared-memory segment on this host that a consumer may read in place
    # (vLLM's workers load it themselves: weightsync.vllm_shm_engine)
    shared_memory: ClassVar[bool] = False
    # a version lies in GPU memory on this host that a consumer opens by CUDA IPC handle and may
    # read in place (vLLM's workers load it themselves: weightsync.vllm_ipc_engine)
    device_ipc: ClassVar[bool] = False
    # the publisher may write versions from its background thread while the learner trains on
    # (False: written before ``Publisher.submit`` returns, e.g. a broadcast the actors take part in)
    background: ClassVar[bool] = False
    # actors join the learner's torch.distributed group (over ``weightsync.backend``): under NCCL
    # no two of its processes may share a GPU
    process_group: ClassVar[bool] = False
    # with ``weightsync.relay`` one relay per actor host receives for all its actors (``weightsync.relay``)
    relays: ClassVar[bool] = False

    @abstractmethod
    def sender(
        self,
        ws: WeightSyncConfig,
        client: redis.Redis,
        keys: Keys,
        layout: Layout,
        *,
        publisher: str = "",
        host_id: str = "",
    ) -> Sender:
        """The learner side, for one model's ``layout``; ``publisher``: the publisher's id, ``host_id``:
        the learner's ``run.host_id``."""

    @abstractmethod
    def receiver(
        self, ws: WeightSyncConfig, client: redis.Redis, keys: Keys, actor_id: str
    ) -> Receiver:
        """One actor's side."""

    def describe(self, meta: dict) -> dict:
        """What ``streamrl inspect`` shows about an announced version beyond its number."""
        return {}
