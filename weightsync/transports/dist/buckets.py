"""The bucket plan of the dist transport: a layout's byte stream cut into consecutive fixed-size
buckets, each broadcast as one collective. Publisher and members compute the same plan."""

from __future__ import annotations

import torch

from streamrl.weightsync.layout import Layout

# per bucket: (tensor name, first byte in tensor, end byte in tensor, offset in bucket)
Window = list[tuple[str, int, int, int]]


def windows(layout: Layout, bucket_bytes: int) -> list[Window]:
    """Cut the layout's byte stream into consecutive buckets of ``bucket_bytes`` (the last may be shorter).

    Alignment gaps between tensors travel as padding; a tensor larger than a
    bucket spans several. Publisher and members compute the same plan.
    """
    if bucket_bytes <= 0:
        raise ValueError("bucket_bytes must be positive")
    plan: list[Window] = [[] for _ in range(-(-layout.total_bytes // bucket_bytes))]
    for spec, offset in zip(layout.specs, layout.offsets, strict=True):
        start, end = offset, offset + spec.nbytes
        while start < end:
            index = start // bucket_bytes
            stop = min(end, (index + 1) * bucket_bytes)
            plan[index].append(
                (spec.name, start - offset, stop - offset, start - index * bucket_bytes)
            )
            start = stop
    return plan


def bucket_sizes(layout: Layout, bucket_bytes: int) -> list[int]:
    n = -(-layout.total_bytes // bucket_bytes)
    return [min(bucket_bytes, layout.total_bytes - i * bucket_bytes) for i in range(n)]


# a host slot goes out in pieces of at most this, each broadcast while the next is written into
# the slot: the first piece's copy is all the copy the broadcast waits for
PIECE_BYTES = 4 << 20


def piece_bytes(bucket_bytes: int) -> int:
    """The pieces a slot's byte stream is broadcast in (at most ``bucket_bytes``): a multiple of
    64, so every piece ends at a multiple of 8 within each tensor (summed piece by piece)."""
    return max(64, min(bucket_bytes, PIECE_BYTES) // 64 * 64)


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.reshape(-1).view(torch.uint8)
