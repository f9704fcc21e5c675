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
from streamrl.configs.schema import Config
from streamrl.weightsync import metrics
from streamrl.weightsync.announce import announce
from streamrl.weightsync.layout import Layout, TensorSpec
from streamrl.weightsync.naming import canonical_tensors
from streamrl.weightsync.policy import resolve_dtype


@dataclass(frozen=True)
class PublishStats:
    version: int
    seconds: float
    bytes: int
    transport: str


def engine_dtype(cfg: Config, engine: str) -> torch.dtype:
    """The dtype one actor engine computes in: vLLM on this host's GPU if it has one (its CPU build
    in float32), the hf engine on ``actor.device``."""
    if engine == "vllm":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    else:
        device = cfg.actor.device
    return resolve_dtype(cfg.model.dtype, device)


def transfer_dtype(cfg: Config) -> torch.dtype:
    """``weightsync.dtype``; auto = the dtype the actors' engines compute in.

    Engines that compute in different dtypes (a vLLM actor in bfloat16 on a GPU next to an hf
    actor in float32 on CPU) get float32: each converts it down to what it computes in, as it
    would the learner's own weights, while a half-precision publish would round the float32
    engine's weights.
    """
    if cfg.weightsync.dtype != "auto":
        return resolve_dtype(cfg.weightsync.dtype)
    dtypes = {engine_dtype(cfg, engine) for engine in cfg.actor.engines_in_use}
    return dtypes.pop() if len(dtypes) == 1 else torch.float32


class Publisher:
    def __init__(self, cfg: Config, client: redis.Redis | None = None):
        self.cfg = cfg
        self.keys = Keys.from_config(cfg)
        self.client = client or connect_sync(cfg.broker, cfg.run.dir)
        self.transport = cfg.weightsync.transport
        self.dtype = transfer_dtype(cfg)
        self.id = uuid.uuid4().hex[:12]
        self.last_version: int | None = None
        self._layout: Layout | None = None
        self._sender = None

    @classmethod
    def from_config(cls, cfg: Config) -> Publisher:
        return cls(cfg)

    def _spec(self, name: str, tensor: torch.Tensor) -> TensorSpec:
        # integer/bool tensors (rare in a policy) keep their dtype; floats travel in the engines' dtype
        return TensorSpec.of(name, tensor, self.dtype if tensor.is_floating_point() else None)

    def _open(self, layout: Layout):
        ws = self.cfg.weightsync
        if self.transport == "shm":
            from streamrl.weightsync.shm import ShmWriter

            return ShmWriter(self.cfg.run.name, layout, ws.slots, ws.timeout_s)
        if self.transport == "dist":
            from streamrl.weightsync.dist import DistSender

            return DistSender(
                self.client,
                self.keys,
                layout,
                bucket_bytes=ws.bucket_bytes,
                timeout_s=ws.timeout_s,
                backend=ws.backend,
                host=ws.dist_host,
            )
        return None

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
            self._sender = self._open(layout)
        elif layout != self._layout:
            raise ValueError(
                "published tensors changed names, shapes or dtypes since the first publish; a publisher serves one model"
            )
        meta = {"layout": layout.to_json(), "aliases": aliases}
        if self.transport == "shm":
            slot, overrode = self._sender.write(version, tensors)
            if overrode:
                metrics.TRANSFER_FAILURES.labels(reason="lease_timeout").inc()
            meta.update(segment=self._sender.name, slot=slot)
        elif self.transport == "dist":
            meta.update(self._sender.send(version, tensors, aliases))
        announce(self.client, self.keys, version, self.transport, self.id, meta)
        seconds = time.perf_counter() - start
        nbytes = layout.total_bytes if self.transport != "none" else 0
        self.last_version = version
        metrics.PUBLISH_SECONDS.observe(seconds)
        metrics.PUBLISH_BYTES.inc(nbytes)
        metrics.PUBLISHED_VERSION.set(version)
        return PublishStats(version, seconds, nbytes, self.transport)

    def close(self) -> None:
        if self._sender is not None:
            self._sender.close()
            self._sender = None
