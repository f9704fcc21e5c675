"""The GPU-free logic of the vLLM actor's weight path, plus one thin function that calls vLLM.

vLLM (>= 0.33) receives weights through its native weight-transfer API:
``init_weight_transfer_engine`` once, then per version ``start_weight_update``,
``update_weights`` per bucket (names, dtype names, shapes of the tensors the
trainer-side engine sends) and ``finish_weight_update(weight_version=...)``,
all between ``pause_generation(mode="keep")`` and ``resume_generation()`` so
in-flight requests survive the swap. Each ``CompletionOutput`` then reports
``weight_versions`` spans, turned here into the per-token versions the wire
format carries. Only ``push_weights`` touches vLLM (imported lazily).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from weightsync.layout import TensorSpec


@dataclass(frozen=True)
class Bucket:
    specs: tuple[TensorSpec, ...]

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.specs)

    def update_info(self) -> dict:
        """The per-bucket metadata vLLM's update_weights expects."""
        return {
            "names": [s.name for s in self.specs],
            "dtype_names": [s.dtype for s in self.specs],
            "shapes": [list(s.shape) for s in self.specs],
        }


def plan_buckets(specs: Sequence[TensorSpec], bucket_bytes: int) -> list[Bucket]:
    """Greedy, order-preserving buckets of at most ``bucket_bytes``; a larger tensor gets a bucket alone."""
    if bucket_bytes <= 0:
        raise ValueError("bucket_bytes must be positive")
    buckets: list[Bucket] = []
    current: list[TensorSpec] = []
    size = 0
    for spec in specs:
        if current and size + spec.nbytes > bucket_bytes:
            buckets.append(Bucket(tuple(current)))
            current, size = [], 0
        current.append(spec)
        size += spec.nbytes
    if current:
        buckets.append(Bucket(tuple(current)))
    return buckets


def token_versions(spans: Sequence[Sequence[int]], num_tokens: int) -> np.ndarray:
    """Per-token policy versions from ``(first token index, version)`` spans, e.g. ``[(0, 4), (7, 5)]``.

    Spans must start at token 0, have increasing starts inside the completion
    and non-decreasing versions (weights only move forward during a request).
    """
    if num_tokens == 0:
        return np.zeros(0, dtype=np.int64)
    if not spans:
        raise ValueError(f"no version spans for {num_tokens} tokens")
    starts = [int(s[0]) for s in spans]
    versions = [int(s[1]) for s in spans]
    if starts[0] != 0:
        raise ValueError(f"version spans must start at token 0, got {starts[0]}")
    if any(b <= a for a, b in zip(starts, starts[1:], strict=False)) or starts[-1] >= num_tokens:
        raise ValueError(f"span starts {starts} must increase and lie inside {num_tokens} tokens")
    if any(b < a for a, b in zip(versions, versions[1:], strict=False)) or versions[0] < 0:
        raise ValueError(f"span versions {versions} must be non-negative and non-decreasing")
    bounds = starts[1:] + [num_tokens]
    return np.repeat(np.asarray(versions, dtype=np.int64), np.diff([0, *bounds]))


async def push_weights(engine, version: int, buckets: Sequence[Bucket], send_bucket) -> None:
    """Swap ``version`` into a running vLLM AsyncLLM between decode steps.

    ``send_bucket(bucket)`` is the trainer-side send (e.g. an NCCL broadcast)
    that runs while vLLM's ``update_weights`` receives the same bucket.
    """
    import asyncio

    import vllm  # noqa: F401  (the optional extra; fail here, not at import of this module)

    await engine.pause_generation(mode="keep")
    try:
        await engine.start_weight_update()
        for bucket in buckets:
            await asyncio.gather(
                engine.update_weights(update_info=bucket.update_info()),
                asyncio.to_thread(send_bucket, bucket),
            )
        await engine.finish_weight_update(weight_version=version)
    finally:
        await engine.resume_generation()
