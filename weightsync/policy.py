"""The one policy loader that learner and actors share, so both see the same module names and dtype."""

from __future__ import annotations

import os

import torch

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(dtype: str | torch.dtype, device: str | torch.device = "cpu") -> torch.dtype:
    """``auto`` = bfloat16 on CUDA, float32 elsewhere (CPU bf16 matmuls are slow and less exact)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; expected auto, {', '.join(_DTYPES)}")
    return _DTYPES[dtype]


def load_policy(path: str | os.PathLike, dtype: str | torch.dtype = "auto", device: str = "cpu"):
    """A causal LM from a Hugging Face folder, on ``device``, in eval mode (dropout off for sampling)."""
    from transformers import AutoModelForCausalLM

    if not os.path.isdir(path):
        raise FileNotFoundError(f"policy folder {os.fspath(path)!r} does not exist")
    model = AutoModelForCausalLM.from_pretrained(
        os.fspath(path), dtype=resolve_dtype(dtype, device)
    )
    return model.to(device).eval()


def load_tokenizer(path: str | os.PathLike):
    """The tokenizer saved next to the policy."""
    from transformers import AutoTokenizer

    if not os.path.isdir(path):
        raise FileNotFoundError(f"tokenizer folder {os.fspath(path)!r} does not exist")
    return AutoTokenizer.from_pretrained(os.fspath(path))
