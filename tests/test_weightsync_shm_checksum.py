"""The shm seqlock's stamps are not enough on a weakly ordered CPU: every tensor carries a checksum
that the reader checks on the bytes it holds, so a copy that mixes versions, or old data under new
stamps, is refused as torn (and the subscriber reads again)."""

from __future__ import annotations

import uuid

import numpy as np
import pytest
import torch

from streamrl.weightsync.layout import Layout, TensorSpec
from streamrl.weightsync.transports.shm.checksum import (
    checksum,
    checksum_of_sum,
    copy_with_checksum,
    word_sum,
)
from streamrl.weightsync.transports.shm.segment import HEADER_BYTES, SHM_DIR
from streamrl.weightsync.transports.shm.slots import ShmReader, ShmWriter

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


@pytest.mark.parametrize("nbytes", [0, 5, 8, 13, (1 << 20) + 3, (33 << 20) + 5, (34 << 20) + 16])
def test_the_blockwise_copy_and_the_device_sum_give_the_reference_checksum(nbytes):
    """``copy_with_checksum`` (on CPU, block by block) and ``word_sum`` (a GPU's) against the
    plain one-pass ``checksum``, on sizes with and without a tail and across block edges."""
    g = torch.Generator().manual_seed(nbytes)
    src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=g)
    dst = torch.zeros_like(src)
    assert copy_with_checksum(dst, src, 9) == checksum(src, 9)
    assert torch.equal(dst, src)
    assert checksum_of_sum(int(word_sum(src)), 9) == checksum(src, 9)


def test_the_device_sum_of_a_misaligned_view_equals_the_reference():
    """A parameter inside a flat buffer may start off an 8-byte boundary."""
    flat = torch.randn(1001)
    view = flat[1:1000]
    assert view.data_ptr() % 8
    assert checksum_of_sum(int(word_sum(view)), 2) == checksum(view.contiguous(), 2)


def test_the_sum_wraps_modulo_2_64_like_the_reference():
    big = torch.full((64,), -1, dtype=torch.int64)
    assert checksum_of_sum(int(word_sum(big)), 0) == checksum(big, 0) == (2**64 - 64)


def test_checksums_taken_by_the_publisher_are_stored_and_a_mismatch_is_torn(segment):
    """The writer trusts checksums given to it (a GPU took them before its copy); the reader still
    checks what it copied against them."""
    writer, reader = segment
    tensors = _tensors(6)
    sums = {name: checksum(t, 6) for name, t in tensors.items()}
    slot, _ = writer.write(6, tensors, sums)
    assert reader.read_into(6, slot, LAYOUT, PAIRS, _dest()) == "ok"
    wrong = dict(sums, w=sums["w"] ^ 1)
    slot, _ = writer.write(7, tensors, wrong)
    assert reader.read_into(7, slot, LAYOUT, PAIRS, _dest()) == "torn"


def test_layout_sums_are_each_tensors_word_sum_in_a_zero_padded_buffer():
    """``layout_sums`` (blocks, running sum, differences) against ``word_sum`` tensor by tensor:
    odd byte counts (a tail word), an empty tensor, one tensor, several dtypes."""
    from streamrl.weightsync.layout import Layout, TensorSpec
    from streamrl.weightsync.transports.shm.checksum import layout_sums

    gen = torch.Generator().manual_seed(0)
    specs = [
        TensorSpec("a", (3, 5), "bfloat16"),
        TensorSpec("empty", (0,), "float32"),
        TensorSpec("c", (7,), "uint8"),
        TensorSpec("d", (33, 9), "float32"),
        TensorSpec("e", (1,), "float16"),
    ]
    for chosen in (specs, specs[3:4]):
        layout = Layout.build(chosen)
        flat = torch.zeros(layout.padded_bytes, dtype=torch.uint8)
        views = layout.views(flat)
        for view in views.values():
            raw = view.view(torch.uint8)
            raw.copy_(torch.randint(0, 256, raw.shape, generator=gen, dtype=torch.uint8))
        expected = [int(word_sum(views[spec.name])) for spec in layout.specs]
        assert layout_sums(flat, layout).tolist() == expected
    with pytest.raises(ValueError, match="flat uint8 buffer"):
        layout_sums(flat[:-1], layout)
