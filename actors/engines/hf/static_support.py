"""Whether the installed transformers can carry the static decode batch (``static_decode``).

The batch plugs its own cache layers into transformers' layered ``Cache``: it needs
``cache_utils.CacheLayerMixin``, a ``Cache`` built from a list of layers, and the mask-size hook
in the form ``SlotLayer`` implements (``get_mask_sizes(query_length)``; earlier releases passed
``cache_position``). These are checked by what the module provides, not by a version number, so
a transformers that lacks one decodes on the dynamic batch with the reason logged, instead of
failing at import or mid-decode.
"""

from __future__ import annotations

import inspect


def static_cache_unsupported() -> str | None:
    """Why the installed transformers cannot carry ``StaticBatch``; None when it can."""
    from transformers import __version__, cache_utils

    where = f"transformers {__version__}"
    layer = getattr(cache_utils, "CacheLayerMixin", None)
    if layer is None:
        return f"{where} has no cache_utils.CacheLayerMixin"
    if "layers" not in inspect.signature(cache_utils.Cache.__init__).parameters:
        return f"{where}'s Cache takes no layers"
    hook = getattr(layer, "get_mask_sizes", None)
    params = list(inspect.signature(hook).parameters)[1:] if hook is not None else None
    if params != ["query_length"]:
        return f"{where}'s CacheLayerMixin.get_mask_sizes takes {params}, not [query_length]"
    return None
