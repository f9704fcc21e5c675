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


def parameter_template(
    path: str | os.PathLike, dtype: str | torch.dtype = "auto", device: str = "cpu"
) -> dict[str, torch.Tensor]:
    """The policy's parameter names and shapes on ``device``, without loading (or allocating) its weights.

    For engines that hold no transformers model (vLLM): the subscriber needs a
    template of the engine's parameters to map published names onto and to
    allocate its staging copy on ``device``. The model is built from its config
    on the meta device, so the names are exactly those ``load_policy`` (and so
    the learner) gives, tied weights listed once. Each entry is a one-element
    placeholder expanded to the parameter's shape (stride 0): the subscriber
    reads only names, shapes, devices and which names share a storage.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    if not os.path.isdir(path):
        raise FileNotFoundError(f"policy folder {os.fspath(path)!r} does not exist")
    config = AutoConfig.from_pretrained(os.fspath(path))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    dtype = resolve_dtype(dtype, device)
    return {
        name: torch.empty((), dtype=dtype, device=device).expand(param.shape)
        for name, param in model.named_parameters()
    }


def load_tokenizer(path: str | os.PathLike):
    """The tokenizer saved next to the policy."""
    from transformers import AutoTokenizer

    if not os.path.isdir(path):
        raise FileNotFoundError(f"tokenizer folder {os.fspath(path)!r} does not exist")
    return AutoTokenizer.from_pretrained(os.fspath(path))
