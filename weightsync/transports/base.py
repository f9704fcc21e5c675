"""What a weight transport is: a sender on learner rank 0 that publishes one version to the actors,
and a receiver on each actor that receives the newest wanted version into the subscriber's staging
copy.

The publisher and subscriber own versions, announcements and the staging copy; a transport owns
only how the bytes travel, and declares its capabilities (the class attributes of ``Transport``,
each documented here once) so no caller compares transport names. Light on purpose: the registry
imports this, and this imports nothing heavy.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol

from streamrl.configs.errors import StreamRLError

if TYPE_CHECKING:
    import redis
    import torch

    from streamrl.broker.keys import Keys
    from streamrl.configs.actor import ActorConfig
    from streamrl.configs.section import Section
    from streamrl.configs.weightsync import WeightSyncConfig
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
        """Publish one version (tensors by published name, already in the transfer dtype); returns
        what the announcement's metadata adds so receivers find it. ``checksums``: the tensors' shm
        checksums when the publisher already took them (on a GPU), for a transport that stores them."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Fill:
    """The staging copy a receiver claimed (``Staging.begin_fill``)."""

    # by engine name
    tensors: dict[str, torch.Tensor]
    # (engine name, published name) of every staged tensor
    pairs: list[tuple[str, str]]
    # the one buffer ``tensors`` are views of, in the published layout, or None (tensors alone)
    flat: torch.Tensor | None


class Staging(Protocol):
    """The subscriber as a receiver sees it (``weightsync.subscriber.Subscriber``)."""

    @property
    def announced(self) -> Announcement | None:
        """The newest announcement read so far."""
        ...

    @property
    def version(self) -> int:
        """The version of the engine's live weights."""
        ...

    def wanted(self, reread: bool = False) -> Announcement | None:
        """The newest announcement if it is a version to receive (newer than the live and staged
        ones, not skipped), else None; ``reread``: read it from Redis again first (a newer version
        may replace the one being received)."""
        ...

    def begin_fill(
        self, layout: Layout, aliases: dict[str, str], wait_s: float = 0.0, flat: bool = False
    ) -> Fill | None:
        """Claim the staging copy for writing, allocated for ``layout`` (as one buffer where it
        can be, with ``flat``); None while the engine holds it. Raises ``NameMappingError`` when
        the published names do not map onto the engine's."""
        ...

    def end_fill(
        self,
        version: int | None,
        publisher: str | None,
        seconds: float | None = None,
        source: str = "",
    ) -> None:
        """Release the copy ``begin_fill`` claimed: staged as ``version``, received in ``seconds``
        from ``source`` (the shm segment read, where there is one); or empty if ``version`` is None."""
        ...

    def fail(self, reason: str, detail: str = "", skip: Announcement | None = None) -> None:
        """Count a failed transfer under ``reason`` (the failures metric's label); ``skip``: never
        try that announcement's version again (a newer one is received)."""
        ...


class Receiver(Protocol):
    def step(self, staging: Staging) -> float:
        """One turn of the subscriber's background thread: receive the newest wanted version into
        ``staging``; returns how long to wait for the next announcement (0: step again at once)."""
        ...

    def close(self) -> None: ...


class Transport(ABC):
    """One way weights travel, registered by ``name`` in ``weightsync.transports``. Each transport
    declares every capability below itself; the config schema gives its ``options`` the section
    ``weightsync.<name>``."""

    name: ClassVar[str]
    # what it is, in the config reference's words (``weightsync.transport``)
    summary: ClassVar[str]
    # the transport's own settings, the config section ``weightsync.<name>`` (None: it has none)
    options: ClassVar[type[Section] | None]
    # False: the learner publishes nothing and actors keep the weights they loaded
    publishes: ClassVar[bool]
    # a version lies in a shared-memory segment on this host that a consumer may read in place
    # (vLLM's workers load it themselves: actors.engines.vllm.shm_backend)
    shared_memory: ClassVar[bool]
    # a version lies in GPU memory on this host that a consumer opens by CUDA IPC handle and may
    # read in place (vLLM's workers load it themselves: actors.engines.vllm.cuda_ipc_backend)
    device_ipc: ClassVar[bool]
    # the publisher may write versions from its background thread while the learner trains on
    # (False: written before ``Publisher.submit`` returns, e.g. a broadcast the actors take part in)
    background: ClassVar[bool]

    def relayed(self, ws: WeightSyncConfig) -> bool:
        """Whether under ``ws`` one relay per actor host receives every version for all its actors
        and hands it on over shm (``weightsync.relay``)."""
        return False

    def group_backend(self, ws: WeightSyncConfig) -> str | None:
        """The torch.distributed backend (auto, nccl, gloo) of the group the actors join under
        ``ws``, where they join the learner's (under NCCL no two of its processes may share a
        GPU); None: no group."""
        return None

    def check(self, ws: WeightSyncConfig, actor: ActorConfig) -> None:  # noqa: B027 - most serve any actor
        """Raise ``ValueError``, saying why, when this transport cannot serve ``actor``'s engines
        (run at config load)."""

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

    def describe(self, meta: dict, run_name: str | None = None) -> dict:
        """What ``streamrl inspect`` shows about an announced version of ``run_name`` beyond its
        number; ``meta`` comes from Redis (data: names in it are checked before any is opened)."""
        return {}
