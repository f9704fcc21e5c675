"""weightsync: versioned weights from the learner to running actors without pausing generation.

Owns loading a policy folder (``policy``: the one loader learner and actors
share), the learner-to-engine name mapping (``naming``), the publisher and
subscriber (``publisher``, ``subscriber``) over the transports registered in
``transports`` by name: POSIX shared memory on one host (``shm``, segment code
in ``shm``), torch.distributed broadcast in buckets (``dist``: NCCL on GPUs,
gloo on CPU, group code in ``dist``) and ``none``, plus the GPU-free logic of
the vLLM weight-transfer adapter (``vllm_adapter``).

Talks to: Redis through ``broker`` (version announcements, rendezvous).
May import: ``configs``, ``broker``. Must not import ``actors`` or ``learner``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from streamrl.configs.schema import Config
    from streamrl.weightsync.publisher import Publisher
    from streamrl.weightsync.subscriber import Subscriber


def make_publisher(cfg: Config) -> Publisher:
    """The learner rank-0 publisher for ``cfg.weightsync.transport``; connects to the run's Redis."""
    from streamrl.weightsync.publisher import Publisher

    return Publisher.from_config(cfg)


def make_subscriber(cfg: Config, actor_id: str, template: dict[str, torch.Tensor]) -> Subscriber:
    """An actor's subscriber; ``template`` is the engine's named parameters (names, shapes, dtypes, device)."""
    from streamrl.weightsync.subscriber import Subscriber

    return Subscriber.from_config(cfg, actor_id, template)
