"""The checksums of a slot's tensors: what makes a reader refuse a copy the seqlock alone would pass.

The version stamps (``segment``) would rely on x86's store and load ordering (Python has no
fences to place): on a weakly ordered CPU (ARM) a reader could see the new stamps with old or
half-written data. So every tensor of a slot carries a checksum (its bytes summed as 64-bit
words, mixed with the version; one table per slot) that the reader checks on the bytes it
actually holds, and such a copy is refused as torn and read again. Its cost is measured by
``bench/shm_checksum.py``: a word sum runs at memory speed (as fast as xxh3 here), can be taken
on a GPU (``word_sum``, ``layout_sums``: what the publisher and the ``cuda_ipc`` transport use),
and on CPU is folded into the copy block by block (``copy_with_checksum``) so the bytes are
summed while in cache.
"""

from __future__ import annotations

import numpy as np
import torch

from streamrl.weightsync.layout import ALIGN, Layout

# mixes the version into a checksum: the same bytes under another version do not match
_VERSION_MIX = 0x9E3779B97F4A7C15
# bytes copied and summed at a time: small enough to be summed while still in L2
_BLOCK = 1 << 20
# below this a tensor is still in the last-level cache after its copy: two passes are cheaper
# than blocks (measured: 1.22x a plain copy against 1.48x at 10 MB; 1.46x against 1.31x at 100 MB)
_FUSE_ABOVE = 32 << 20


def _mix(total: int, version: int) -> int:
    return (total + version * _VERSION_MIX) % 2**64


def checksum(tensor: torch.Tensor, version: int) -> int:
    """The bytes of a contiguous CPU tensor summed as little-endian uint64 words (the tail
    zero-padded), plus a multiple of ``version``: a copy mixing two versions, or old data under
    a new stamp, fails to match except by a 2**-64 chance."""
    return _mix(raw_sum(tensor.reshape(-1).view(torch.uint8).numpy()), version)


def raw_sum(raw: np.ndarray) -> int:
    """``checksum``'s word sum of the uint8 array ``raw`` before the version is mixed in. A tensor's
    sum is the sum over any split of its bytes at multiples of 8 from its start (the slot's
    writer sums a tensor piece by piece as it copies it)."""
    whole = raw.size - raw.size % 8
    # uint64 sums wrap modulo 2**64 (and np.sum keeps the dtype: passing one is 4x slower)
    total = int(raw[:whole].view(np.uint64).sum())
    if whole < raw.size:
        total += int.from_bytes(raw[whole:].tobytes(), "little")
    return total


def word_sum(tensor: torch.Tensor) -> torch.Tensor:
    """``checksum``'s word sum before the version is mixed in, as a 0-dim int64 on the tensor's
    own device (no sync: a GPU sums its tensors before they are copied to the host). int64
    additions wrap like uint64 ones; ``checksum_of_sum`` maps the result back."""
    raw = tensor.reshape(-1).view(torch.uint8)
    whole = raw.numel() - raw.numel() % 8
    head = raw[:whole]
    if head.data_ptr() % 8:
        # an int64 view needs 8-byte alignment (a parameter inside a flat buffer may lack it)
        head = head.clone()
    total = head.view(torch.int64).sum()
    if whole < raw.numel():
        tail = raw[whole:].to(torch.int64)
        shifts = torch.arange(tail.numel(), device=tail.device, dtype=torch.int64) * 8
        total = total + (tail << shifts).sum()
    return total


def layout_sums(flat: torch.Tensor, layout: Layout) -> torch.Tensor:
    """``word_sum`` of every tensor of ``layout`` in the flat uint8 buffer ``flat`` (of at least
    ``layout.padded_bytes``), as an int64 [tensors] on its device, in a handful of kernels whatever the
    tensor count: a model has hundreds of tensors, and a GPU reduction each costs more in
    launches than in bytes.

    The layout starts every tensor at a multiple of ``ALIGN`` (64) bytes, so each 64-byte block
    of the buffer lies within one tensor's extent (the tensor, then the padding up to the next
    one) or in padding alone: the blocks are summed as 8 words each, and a tensor's sum is the
    difference of the blocks' running sum across its extent. The padding is summed with its
    tensor, so it must be zero: allocate the buffer zeroed and write only the tensors' bytes.
    """
    padded = layout.padded_bytes
    if flat.dtype != torch.uint8 or flat.dim() != 1 or flat.numel() < padded:
        raise ValueError(
            f"need a flat uint8 buffer of >= {padded} bytes, got {flat.dtype} {tuple(flat.shape)}"
        )
    words = flat[:padded]
    if words.data_ptr() % 8:
        words = words.clone()
    blocks = words.view(torch.int64).view(-1, ALIGN // 8).sum(1)
    # running[i] = the sum of blocks before block i; int64 additions wrap like word_sum's
    running = torch.zeros(blocks.numel() + 1, dtype=torch.int64, device=flat.device)
    torch.cumsum(blocks, 0, out=running[1:])
    bounds = torch.tensor(
        [
            [offset // ALIGN, -(-(offset + spec.nbytes) // ALIGN)]
            for spec, offset in zip(layout.specs, layout.offsets, strict=True)
        ],
        dtype=torch.int64,
    ).reshape(-1, 2)
    bounds = bounds.to(flat.device)
    return running[bounds[:, 1]] - running[bounds[:, 0]]


def checksum_of_sum(total: int, version: int) -> int:
    """The checksum from ``word_sum``'s value (a signed int64)."""
    return _mix(total % 2**64, version)


def copy_with_checksum(dst: torch.Tensor, src: torch.Tensor, version: int) -> int:
    """``dst.copy_(src)`` for contiguous CPU tensors of one dtype, returning ``checksum(dst)``."""
    return _mix(
        copy_summed(dst.reshape(-1).view(torch.uint8), src.reshape(-1).view(torch.uint8)), version
    )


def copy_summed(d: torch.Tensor, s: torch.Tensor) -> int:
    """``d.copy_(s)`` for flat uint8 CPU tensors, returning ``raw_sum`` of what ``d`` now holds.
    More bytes than the cache holds are copied block by block, each block summed right after it
    landed, so memory is crossed once."""
    held = d.numpy()
    if d.numel() <= _FUSE_ABOVE:
        d.copy_(s)
        return raw_sum(held)
    total = 0
    for start in range(0, d.numel(), _BLOCK):
        stop = min(start + _BLOCK, d.numel())
        d[start:stop].copy_(s[start:stop])
        total += raw_sum(held[start:stop])
    return total
