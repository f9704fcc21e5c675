"""The one policy loader that learner and actors share, so both see the same module names and dtype.

``model.path`` is a local Hugging Face folder or a hub id (``org/name``, optionally
``org/name@revision``). A hub id resolves through ``huggingface_hub.snapshot_download``
to a snapshot folder of the local hub cache (``HF_HOME`` / ``HF_HUB_CACHE``), downloading
it when it is missing; ``HF_HUB_OFFLINE=1``, when the user sets it, keeps it to the cache.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # imported where a model or dtype is made: the launcher checks a model path through this
    # module before it starts anyone, and importing torch there cost every launch ~1.3 CPU-s
    import torch

_DTYPES = ("float32", "bfloat16", "float16")


def resolve_dtype(dtype: str | torch.dtype, device: str | torch.device = "cpu") -> torch.dtype:
    """``auto`` = bfloat16 on CUDA, float32 elsewhere (CPU bf16 matmuls are slow and less exact)."""
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; expected auto, {', '.join(_DTYPES)}")
    return getattr(torch, dtype)


def _split_revision(path: str) -> tuple[str, str | None]:
    repo_id, sep, revision = path.partition("@")
    return repo_id, (revision if sep else None)


def model_folder(path: str | os.PathLike) -> str:
    """``path`` itself when it is a folder, else the snapshot folder of hub id ``path``.

    Raises FileNotFoundError naming the path and the reason when it is neither.
    """
    import huggingface_hub.constants
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError

    path = os.fspath(path)
    if os.path.isdir(path):
        return path
    if os.path.exists(path):
        raise FileNotFoundError(f"model.path {path!r} is a file, not a Hugging Face folder")
    repo_id, revision = _split_revision(path)
    try:
        return snapshot_download(repo_id, revision=revision)
    except HFValidationError as exc:
        raise FileNotFoundError(
            f"model.path {path!r} is not a local folder nor a hub id: {exc}"
        ) from None
    # offline cache miss, unknown repo, gated repo, network down
    except Exception as exc:
        if huggingface_hub.constants.HF_HUB_OFFLINE:
            raise FileNotFoundError(
                f"model.path {path!r} is not a local folder nor in the hub cache "
                f"({huggingface_hub.constants.HF_HUB_CACHE}), and HF_HUB_OFFLINE=1 keeps to the "
                "cache: download it first (huggingface-cli download) or unset HF_HUB_OFFLINE"
            ) from None
        raise FileNotFoundError(
            f"model.path {path!r} is not a local folder and the hub id could not be resolved "
            f"({type(exc).__name__}: {exc})"
        ) from None


def load_policy(
    path: str | os.PathLike,
    dtype: str | torch.dtype = "auto",
    device: str = "cpu",
    init_kwargs: Mapping[str, Any] | None = None,
):
    """A causal LM from a Hugging Face folder or hub id, on ``device``, in eval mode (dropout off).

    ``init_kwargs`` (``model.init_kwargs``, checked by the schema) go to from_pretrained as they
    are: ``attn_implementation``, ``trust_remote_code`` only where the user set it.
    """
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        model_folder(path), dtype=resolve_dtype(dtype, device), **(init_kwargs or {})
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
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_folder(path))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    dtype = resolve_dtype(dtype, device)
    return {
        name: torch.empty((), dtype=dtype, device=device).expand(param.shape)
        for name, param in model.named_parameters()
    }


def load_tokenizer(path: str | os.PathLike):
    """The tokenizer saved next to the policy (folder or hub id)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_folder(path))


def stop_token_ids(tokenizer, path: str | os.PathLike) -> list[int]:
    """The tokens that end a completion: the tokenizer's end of sequence and the model config's."""
    from transformers import AutoConfig

    ids = {tokenizer.eos_token_id}
    eos = getattr(AutoConfig.from_pretrained(model_folder(path)), "eos_token_id", None)
    ids.update(eos if isinstance(eos, list) else [eos])
    return sorted(i for i in ids if i is not None)
