"""The learner rank-0 publisher: after an optimizer step, ``publish(version, named_tensors)`` converts the
weights once to the actors' engine dtype, writes them through the configured transport and announces the
version in Redis (``weights`` hash + ``weights:notify``) so running and late actors find it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import redis
import torch

from streamrl.broker.client import connect_sync
from streamrl.broker.keys import Keys
from streamrl.configs.schema import ActorConfig, Config, ModelConfig, WeightSyncConfig
from streamrl.weightsync import metrics, transports
from streamrl.weightsync.announce import announce
from streamrl.weightsync.layout import Layout, TensorSpec
from streamrl.weightsync.naming import canonical_tensors
from streamrl.weightsync.policy import resolve_dtype
from streamrl.weightsync.transports import Sender


@dataclass(frozen=True)
class PublishStats:
    version: int
    seconds: float
    bytes: int
    transport: str


def engine_dtype(model: ModelConfig, actor: ActorConfig, engine: str) -> torch.dtype:
    """The dtype one actor engine computes in: vLLM on this host's GPU if it has one (its CPU build
    in float32), the hf engine on ``actor.device``."""
    if engine == "vllm":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    else:
        device = actor.device
    return resolve_dtype(model.dtype, device)


def transfer_dtype(ws: WeightSyncConfig, model: ModelConfig, actor: ActorConfig) -> torch.dtype:
    """``weightsync.dtype``; auto = the dtype the actors' engines compute in.

    Engines that compute in different dtypes (a vLLM actor in bfloat16 on a GPU next to an hf
    actor in float32 on CPU) get float32: each converts it down to what it computes in, as it
    would the learner's own weights, while a half-precision publish would round the float32
    engine's weights.
    """
    if ws.dtype != "auto":
        return resolve_dtype(ws.dtype)
    dtypes = {engine_dtype(model, actor, engine) for engine in actor.engines_in_use}
    return dtypes.pop() if len(dtypes) == 1 else torch.float32


class Publisher:
    def __init__(self, ws: WeightSyncConfig, keys: Keys, client: redis.Redis, dtype: torch.dtype):
        self.ws = ws
        self.keys = keys
        self.client = client
        self.transport = transports.get(ws.transport)
        self.dtype = dtype
        self.id = uuid.uuid4().hex[:12]
        self.last_version: int | None = None
        self._layout: Layout | None = None
        self._sender: Sender | None = None

    @classmethod
    def from_config(cls, cfg: Config) -> Publisher:
        return cls(
            cfg.weightsync,
            Keys.from_config(cfg),
            connect_sync(cfg.broker, cfg.run.dir),
            transfer_dtype(cfg.weightsync, cfg.model, cfg.actor),
        )

    def _spec(self, name: str, tensor: torch.Tensor) -> TensorSpec:
        # integer/bool tensors (rare in a policy) keep their dtype; floats travel in the engines' dtype
        return TensorSpec.of(name, tensor, self.dtype if tensor.is_floating_point() else None)

    def publish(
        self,
        version: int,
        named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
    ) -> PublishStats:
        """Make ``version`` available to every actor; versions must strictly increase."""
        if not isinstance(version, int) or version < 0:
            raise ValueError(f"version must be a non-negative int, got {version!r}")
        if self.last_version is not None and version <= self.last_version:
            raise ValueError(
                f"versions must strictly increase: got {version} after {self.last_version}"
            )
        start = time.perf_counter()
        tensors, aliases = canonical_tensors(named_tensors)
        layout = Layout.build([self._spec(name, t) for name, t in tensors.items()])
        if self._layout is None:
            self._layout = layout
            self._sender = self.transport.sender(self.ws, self.client, self.keys, layout)
        elif layout != self._layout:
            raise ValueError(
                "published tensors changed names, shapes or dtypes since the first publish; a publisher serves one model"
            )
        meta = {"layout": layout.to_json(), "aliases": aliases}
        meta.update(self._sender.send(version, tensors, aliases))
        announce(self.client, self.keys, version, self.transport.name, self.id, meta)
        seconds = time.perf_counter() - start
        nbytes = layout.total_bytes if self.transport.publishes else 0
        self.last_version = version
        metrics.PUBLISH_SECONDS.observe(seconds)
        metrics.PUBLISH_BYTES.inc(nbytes)
        metrics.PUBLISHED_VERSION.set(version)
        return PublishStats(version, seconds, nbytes, self.transport.name)

    def close(self) -> None:
        if self._sender is not None:
            self._sender.close()
            self._sender = None
