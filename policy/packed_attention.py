"""Packed rows' attention without a 4D mask: the ``streamrl_varlen`` transformers attention function.

Under sdpa, transformers keeps the samples of a packed row apart with a 4D mask built from the
position ids; on a GPU that mask keeps sdpa off its flash kernel, and the mask itself is
[rows, 1, width, width]. This function reads the samples' bounds instead (``cu_seq_lens_q``,
from the position ids) and runs causal attention within each sample: on CUDA in half precision
through torch's variable-length flash kernel (``torch.nn.attention.varlen``), elsewhere through
one causal ``scaled_dot_product_attention`` per sample, the same arithmetic as the mask.

A model switched to it (``use_varlen``) builds no mask at all (transformers skips mask creation
for an attention name it has no mask function for), so it must only run packed rows or
right-padded ones, never left padding: the learner's passes are the only user.
"""

from __future__ import annotations

import functools
import inspect
import logging

import torch
from torch import Tensor
from torch.nn import functional as F

NAME = "streamrl_varlen"
log = logging.getLogger(__name__)


def sample_bounds(position_ids: Tensor) -> Tensor:
    """[rows, width] position ids -> int32 [samples + 1]: where each sample starts in the rows
    flattened end to end, then the total. A sample starts at a row's first column and wherever
    the position does not follow the one before (transformers' ``find_packed_sequence_indices``),
    so a row's padding tail is a sample of its own, as under the mask."""
    starts = torch.ones_like(position_ids, dtype=torch.bool)
    starts[:, 1:] = position_ids[:, 1:] != position_ids[:, :-1] + 1
    first = starts.flatten().nonzero().flatten()
    return torch.cat([first, first.new_tensor([position_ids.numel()])]).to(torch.int32)


def varlen_kwargs(position_ids: Tensor) -> dict:
    """The model kwargs that hand every layer the samples' bounds, computed once per pass (the
    longest sample is read to the host once, not once per layer)."""
    bounds = sample_bounds(position_ids)
    longest = int(bounds.diff().max())
    return {
        "cu_seq_lens_q": bounds,
        "cu_seq_lens_k": bounds,
        "max_length_q": longest,
        "max_length_k": longest,
    }


def varlen_attention_forward(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[Tensor, None]:
    """transformers' attention-function contract: query [B, H, L, D], key and value [B, Hkv, L, D]
    -> ([B, L, H, D], no weights). Causal within each sample of ``cu_seq_lens_q`` (or, without it,
    of the ``position_ids`` kwarg; without either, each row is one sample)."""
    if dropout:
        raise ValueError(f"{NAME}: attention dropout ({dropout}) is not supported")
    if kwargs.get("sliding_window") is not None or kwargs.get("softcap") is not None:
        raise ValueError(f"{NAME}: sliding-window and soft-capped attention are not supported")
    rows, heads, width, dim = query.shape
    bounds, longest = kwargs.get("cu_seq_lens_q"), kwargs.get("max_length_q")
    if bounds is None:
        positions = kwargs.get("position_ids")
        if positions is None:
            positions = torch.arange(width, device=query.device).expand(rows, width)
        found = varlen_kwargs(positions.expand(rows, width))
        bounds, longest = found["cu_seq_lens_q"], found["max_length_q"]
    # [B, H, L, D] -> [B * L, H, D]: the rows end to end, as the bounds count them
    q, k, v = (
        t.transpose(1, 2).reshape(rows * width, t.shape[1], dim) for t in (query, key, value)
    )
    if flash_varlen_applies(q):
        out = flash_varlen(q, k, v, bounds.to(q.device), int(longest), scaling)
    else:
        out = per_sample_attention(q, k, v, bounds.tolist(), scaling)
    return out.view(rows, width, heads, dim), None


def per_sample_attention(
    q: Tensor, k: Tensor, v: Tensor, bounds: list[int], scaling: float | None
) -> Tensor:
    """[T, H, D] -> [T, H, D]: one causal ``scaled_dot_product_attention`` per sample."""
    gqa = k.shape[1] != q.shape[1]
    pieces = [
        F.scaled_dot_product_attention(
            q[a:b].transpose(0, 1),
            k[a:b].transpose(0, 1),
            v[a:b].transpose(0, 1),
            is_causal=True,
            scale=scaling,
            enable_gqa=gqa,
        ).transpose(0, 1)
        for a, b in zip(bounds[:-1], bounds[1:], strict=True)
    ]
    return torch.cat(pieces)


# what ``flash_varlen`` passes by keyword: a torch whose kernel lacks one (``enable_gqa`` arrived
# in 2.12, after the kernel itself) gets the per-sample path, not a TypeError in every layer
KERNEL_KEYWORDS = ("scale", "window_size", "enable_gqa")


@functools.cache
def _varlen_attn():
    """torch's variable-length attention, or None (with the reason logged once) in a torch without
    it or whose kernel does not take every keyword ``flash_varlen`` passes."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError as error:
        log.warning("%s: per-sample attention, no torch varlen kernel (%s)", NAME, error)
        return None
    try:
        parameters = inspect.signature(varlen_attn).parameters
    except (TypeError, ValueError) as error:
        log.warning(
            "%s: per-sample attention, varlen_attn's signature unreadable (%s)", NAME, error
        )
        return None
    missing = [name for name in KERNEL_KEYWORDS if name not in parameters]
    if missing:
        log.warning(
            "%s: per-sample attention, torch %s's varlen_attn takes no %s",
            NAME,
            torch.__version__,
            ", ".join(missing),
        )
        return None
    return varlen_attn


def _device_fits(q: Tensor) -> bool:
    """torch's varlen kernel is flash attention: CUDA, half precision, Ampere (sm80) or newer."""
    return (
        q.is_cuda
        and q.dtype in (torch.float16, torch.bfloat16)
        and torch.cuda.get_device_capability(q.device) >= (8, 0)
    )


def flash_varlen_applies(q: Tensor) -> bool:
    """The device fits the flash kernel and the installed torch has the kernel as called."""
    return _device_fits(q) and _varlen_attn() is not None


def flash_varlen(
    q: Tensor, k: Tensor, v: Tensor, bounds: Tensor, longest: int, scaling: float | None
) -> Tensor:
    """The GPU-only call: causal (window (-1, 0)) flash attention over the samples, GQA by the
    kernel itself (no repeated key/value heads)."""
    return _varlen_attn()(
        q,
        k,
        v,
        bounds,
        bounds,
        longest,
        longest,
        scale=scaling,
        window_size=(-1, 0),
        enable_gqa=k.shape[1] != q.shape[1],
    )


def register() -> None:
    """Make ``NAME`` an attention implementation transformers models can be switched to."""
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, varlen_attention_forward)


def use_varlen(model) -> None:
    """Switch ``model`` (a transformers model, or one wrapped by peft) to ``NAME``: every layer
    reads its attention function from the shared config when it runs, the recomputed forward of
    gradient checkpointing included."""
    register()
    config = getattr(model, "module", model).config
    config._attn_implementation = NAME
