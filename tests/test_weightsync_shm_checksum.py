"""The shm seqlock's stamps are not enough on a weakly ordered CPU: every tensor carries a checksum
that the reader checks on the bytes it holds, so a copy that mixes versions, or old data under new
stamps, is refused as torn (and the subscriber reads again)."""

from __future__ import annotations

import uuid

import numpy as np
import pytest
import torch

from streamrl.weightsync.layout import Layout, TensorSpec
from streamrl.weightsync.shm import HEADER_BYTES, SHM_DIR, ShmReader, ShmWriter, checksum

# an odd byte count (bf16 x 7) exercises the checksum's zero-padded tail
LAYOUT = Layout.build([TensorSpec("w", (64, 3), "float32"), TensorSpec("b", (7,), "bfloat16")])


def _tensors(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "w": torch.randn(64, 3, generator=g),
        "b": torch.randn(7, generator=g).to(torch.bfloat16),
    }


def _dest(dtype_b: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    return {"w": torch.zeros(64, 3), "b": torch.zeros(7, dtype=dtype_b)}


PAIRS = [("w", "w"), ("b", "b")]


@pytest.fixture
def segment():
    writer = ShmWriter(f"sum-{uuid.uuid4().hex[:8]}", LAYOUT, 3, 1.0)
    reader = ShmReader(writer.name, 1.0)
    yield writer, reader
    reader.close()
    writer.close()


def _slot_file(writer: ShmWriter, slot: int) -> np.memmap:
    """The slot's bytes as another process maps them (the segment file itself)."""
    return np.memmap(
        SHM_DIR / writer.name, np.uint8, "r+", HEADER_BYTES + slot * writer.stride, writer.stride
    )


def _stamps(writer: ShmWriter, slot: int) -> np.memmap:
    return np.memmap(SHM_DIR / writer.name, np.int64, "r+", 0, HEADER_BYTES // 8)[
        8 + 2 * slot : 10 + 2 * slot
    ]


def test_an_intact_slot_reads_whole_and_a_flipped_byte_is_refused_as_torn(segment):
    writer, reader = segment
    slot, _ = writer.write(3, _tensors(3))
    dest = _dest()
    assert reader.read_into(3, slot, LAYOUT, PAIRS, dest) == "ok"
    assert torch.equal(dest["w"], _tensors(3)["w"]) and torch.equal(dest["b"], _tensors(3)["b"])
    assert reader.lease(3, slot, LAYOUT) is not None and reader.release()

    data = _slot_file(writer, slot)
    offset = LAYOUT.offsets[1] + 5
    data[offset] ^= 0x01
    data.flush()
    assert reader.read_into(3, slot, LAYOUT, PAIRS, _dest()) == "torn"
    # the in-place consumer (vLLM) is refused the slot too
    assert reader.lease(3, slot, LAYOUT) is None


def test_old_data_under_new_stamps_is_refused(segment):
    """What a reader on ARM may see: the writer's stamp stores visible before its data stores."""
    writer, reader = segment
    slot, _ = writer.write(4, _tensors(4))
    stamps = _stamps(writer, slot)
    stamps[:] = 7
    stamps.flush()
    assert reader.read_into(7, slot, LAYOUT, PAIRS, _dest()) == "torn"


def test_a_converting_copy_is_checked_on_the_slot(segment):
    writer, reader = segment
    slot, _ = writer.write(5, _tensors(5))
    dest = _dest(torch.float32)
    assert reader.read_into(5, slot, LAYOUT, PAIRS, dest) == "ok"
    assert torch.equal(dest["b"], _tensors(5)["b"].float())
    data = _slot_file(writer, slot)
    data[LAYOUT.offsets[1]] ^= 0x80
    data.flush()
    assert reader.read_into(5, slot, LAYOUT, PAIRS, _dest(torch.float32)) == "torn"


def test_the_checksum_covers_every_byte_and_the_version():
    t = torch.arange(13, dtype=torch.uint8)
    base = checksum(t, 1)
    assert checksum(t.clone(), 1) == base and checksum(t, 2) != base
    for i in range(13):
        changed = t.clone()
        changed[i] += 1
        assert checksum(changed, 1) != base, i
