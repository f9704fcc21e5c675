"""The hf engine's prefill: prompts through the model, eagerly, into keys and values per prompt.

Shared by the dynamic decode batch (``hf._Batch``, which splices the keys and values into its
left-padded ``DynamicCache``) and the static one (``static_decode.StaticBatch``, which copies them
into each slot's rows). Identical prompts without a kept cache are run once; a prompt with a kept
session cache (``kv_sessions.Saved``) runs only its tokens past the cache's, on top of them; one
forward pass per (cached length, new length), so prefill never needs padding or a mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache

from streamrl.actors.engines.hf.kv_sessions import Saved

# per layer, [heads, length, head_dim]: one prompt's keys, then its values
KeysValues = tuple[list[torch.Tensor], list[torch.Tensor]]


@dataclass
class Prefilled:
    # [n, V] next-token logits, one row per prompt
    logits: torch.Tensor
    # one per prompt (identical prompts share their tensors)
    kvs: list[KeysValues]
    # the last forward pass's cache: its layers' types and dtypes for a batch that starts empty
    cache: DynamicCache


def prefill(
    model, cache_kw: str, device, prompts: list[list[int]], cached: list[Saved | None]
) -> Prefilled:
    """Run ``prompts`` (each on top of its ``cached`` entry, if any) through ``model``."""
    keys = [
        (None if saved is None else id(saved), tuple(p))
        for p, saved in zip(prompts, cached, strict=True)
    ]
    unique: dict[tuple, Saved | None] = {}
    for key, saved in zip(keys, cached, strict=True):
        unique.setdefault(key, saved)
    groups: dict[tuple[int, int], list[tuple]] = {}
    for key, saved in unique.items():
        past = 0 if saved is None else len(saved.tokens)
        groups.setdefault((past, len(key[1]) - past), []).append(key)
    vocab = model.config.vocab_size
    index = {key: i for i, key in enumerate(unique)}
    unique_logits = torch.empty(len(unique), vocab, device=device)
    unique_kv: dict[tuple, KeysValues] = {}
    for (past, _new), group in groups.items():
        cache = DynamicCache(config=model.config)
        if past:
            saved = [unique[key] for key in group]
            for layer in range(len(saved[0].keys)):
                cache.update(
                    torch.stack([s.keys[layer] for s in saved]),
                    torch.stack([s.values[layer] for s in saved]),
                    layer,
                )
        ids = torch.tensor([key[1][past:] for key in group], dtype=torch.long, device=device)
        out = model(input_ids=ids, **{cache_kw: cache}, use_cache=True, logits_to_keep=1)
        for j, key in enumerate(group):
            unique_logits[index[key]] = out.logits[j, -1]
            unique_kv[key] = (
                [layer.keys[j] for layer in cache.layers],
                [layer.values[j] for layer in cache.layers],
            )
    return Prefilled(
        unique_logits[[index[key] for key in keys]], [unique_kv[key] for key in keys], cache
    )
