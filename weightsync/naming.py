"""Explicit name mapping between the learner's parameters and the engine model's parameters.

The learner may hand over names from a wrapped module (DeepSpeed's
``module.``, ``torch.compile``'s ``_orig_mod.``) and tied weights (``lm_head``
sharing ``embed_tokens``) either once (``named_parameters``) or twice
(``state_dict``). The publisher canonicalises: wrapper prefixes go, each
storage is sent once and the other names become aliases. The subscriber maps
every engine name to a published name and fails loudly, listing every
missing, extra or shape-mismatched name, instead of loading half a model.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

from streamrl.configs.errors import StreamRLError

WRAPPER_PREFIXES = ("module.", "_orig_mod.", "_forward_module.")


class NameMappingError(StreamRLError, ValueError):
    """The published weights and the engine model do not describe the same parameters."""


def strip_wrappers(name: str) -> str:
    """``module._orig_mod.model.x`` -> ``model.x``: drop wrapper prefixes, however nested."""
    changed = True
    while changed:
        changed = False
        for prefix in WRAPPER_PREFIXES:
            if name.startswith(prefix):
                name, changed = name[len(prefix) :], True
    return name


def _storage_key(t: torch.Tensor) -> tuple:
    return (
        t.device,
        t.untyped_storage().data_ptr(),
        t.storage_offset(),
        tuple(t.shape),
        t.stride(),
    )


def canonical_tensors(
    named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Learner side: (tensors by stripped name, each storage once; aliases ``name -> canonical name``)."""
    items = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
    tensors: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    by_storage: dict[tuple, str] = {}
    for raw_name, tensor in items:
        name = strip_wrappers(raw_name)
        if name in tensors or name in aliases:
            raise NameMappingError(
                f"two learner tensors map to {name!r} after stripping wrapper prefixes (second: {raw_name!r})"
            )
        key = _storage_key(tensor)
        if key in by_storage:
            aliases[name] = by_storage[key]
        else:
            by_storage[key] = name
            tensors[name] = tensor
    return tensors, aliases


def map_to_template(
    published: Mapping[str, tuple[int, ...]],
    aliases: Mapping[str, str],
    template: Mapping[str, torch.Tensor],
) -> list[tuple[str, str]]:
    """Engine side: ``[(engine name, published name)]``, one per engine storage.

    Raises NameMappingError listing engine names with no published source
    (missing), published names no engine name uses (extra) and shape mismatches.
    """
    groups: dict[tuple, list[str]] = {}
    for raw_name, tensor in template.items():
        groups.setdefault(_storage_key(tensor), []).append(raw_name)
    pairs: list[tuple[str, str]] = []
    used: set[str] = set()
    missing, mismatched = [], []
    for raw_names in groups.values():
        # names sharing one engine storage (tied weights) are filled by a single copy
        sources = [
            (raw, src)
            for raw in raw_names
            if (src := _source(strip_wrappers(raw), published, aliases))
        ]
        used.update(src for _, src in sources)
        if not sources:
            missing.extend(strip_wrappers(raw) for raw in raw_names)
            continue
        raw_name, source = sources[0]
        shape = tuple(template[raw_name].shape)
        if tuple(published[source]) != shape:
            mismatched.append(
                f"{strip_wrappers(raw_name)}: engine {shape} vs published {source} {tuple(published[source])}"
            )
            continue
        pairs.append((raw_name, source))
    extra = sorted(set(published) - used)
    if missing or extra or mismatched:
        parts = []
        if missing:
            parts.append(f"missing (engine names without published weights): {sorted(missing)}")
        if extra:
            parts.append(f"extra (published names the engine has no parameter for): {extra}")
        if mismatched:
            parts.append(f"shape mismatch: {mismatched}")
        raise NameMappingError("weight names do not match; " + "; ".join(parts))
    return pairs


def _source(
    name: str, published: Mapping[str, tuple[int, ...]], aliases: Mapping[str, str]
) -> str | None:
    if name in published:
        return name
    target = aliases.get(name)
    return target if target in published else None
