"""The flat byte layout of one published weight set: where each tensor lies in a slot or bucket stream.

Both transports use it: a shm slot is this layout in shared memory, and the
dist transport broadcasts it as consecutive fixed-size byte windows. Publisher
and subscribers derive the same layout from the announced specs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# cache-line aligned tensors: typed views on any dtype, no false sharing between tensors
ALIGN = 64


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    # torch dtype name without the "torch." prefix, e.g. "bfloat16"
    dtype: str

    @property
    def torch_dtype(self) -> torch.dtype:
        dtype = getattr(torch, self.dtype, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"tensor {self.name!r}: unknown dtype {self.dtype!r}")
        return dtype

    @property
    def nbytes(self) -> int:
        numel = 1
        for dim in self.shape:
            numel *= dim
        return numel * self.torch_dtype.itemsize

    @classmethod
    def of(cls, name: str, tensor: torch.Tensor, dtype: torch.dtype | None = None) -> TensorSpec:
        return cls(name, tuple(tensor.shape), str(dtype or tensor.dtype).removeprefix("torch."))


@dataclass(frozen=True)
class Layout:
    specs: tuple[TensorSpec, ...]
    offsets: tuple[int, ...]
    total_bytes: int

    @classmethod
    def build(cls, specs: list[TensorSpec] | tuple[TensorSpec, ...]) -> Layout:
        offsets, cursor = [], 0
        for spec in specs:
            cursor = -(-cursor // ALIGN) * ALIGN
            offsets.append(cursor)
            cursor += spec.nbytes
        return cls(tuple(specs), tuple(offsets), cursor)

    @property
    def padded_bytes(self) -> int:
        """``total_bytes`` rounded up to ``ALIGN``: a buffer of this size is whole aligned blocks,
        each within one tensor (and the padding after it) or padding alone."""
        return -(-self.total_bytes // ALIGN) * ALIGN

    def to_json(self) -> list:
        return [[s.name, list(s.shape), s.dtype] for s in self.specs]

    @classmethod
    def from_json(cls, data: list) -> Layout:
        try:
            specs = [
                TensorSpec(str(name), tuple(int(d) for d in shape), str(dtype))
                for name, shape, dtype in data
            ]
        except (TypeError, ValueError) as exc:
            raise ValueError(f"malformed weight layout: {exc}") from exc
        return cls.build(specs)

    def views(self, buffer: torch.Tensor) -> dict[str, torch.Tensor]:
        """Typed tensors over a flat uint8 ``buffer`` of at least ``total_bytes`` (no copy)."""
        if buffer.dtype != torch.uint8 or buffer.dim() != 1 or buffer.numel() < self.total_bytes:
            raise ValueError(
                f"need a flat uint8 buffer of >= {self.total_bytes} bytes, got {buffer.dtype} {tuple(buffer.shape)}"
            )
        out = {}
        for spec, offset in zip(self.specs, self.offsets, strict=True):
            raw = buffer[offset : offset + spec.nbytes]
            out[spec.name] = raw.view(spec.torch_dtype).view(spec.shape)
        return out
