"""What a vLLM completion becomes: our sampling parameters as vLLM's keyword arguments, and a
``CompletionOutput`` as our ``Output`` (behaviour log-probs, per-token versions from its weight
version spans). Pure: tested without vLLM."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from streamrl.actors.engines.base import Output, SamplingParams


def _span(span) -> tuple[int, Any]:
    """``(first token index, label)`` of a vLLM span (``.start``/``.version``) or of a pair."""
    if hasattr(span, "start"):
        return int(span.start), span.version
    return int(span[0]), span[1]


def token_versions(spans: Sequence[Any], num_tokens: int, default: int | None = None) -> np.ndarray:
    """Per-token policy versions from version spans, e.g. ``[(0, 4), (7, 5)]`` or vLLM's span objects.

    vLLM's labels are strings (we set ``str(version)``); a label that is not an
    integer (the engine's label before the first update) becomes ``default``.
    Spans must start at token 0, have increasing starts inside the completion
    and non-decreasing versions (weights only move forward during a request).
    """
    if num_tokens == 0:
        return np.zeros(0, dtype=np.int64)
    if not spans:
        raise ValueError(f"no version spans for {num_tokens} tokens")
    pairs = [_span(s) for s in spans]
    starts = [start for start, _ in pairs]
    versions = [_label(label, default) for _, label in pairs]
    if starts[0] != 0:
        raise ValueError(f"version spans must start at token 0, got {starts[0]}")
    if any(b <= a for a, b in zip(starts, starts[1:], strict=False)) or starts[-1] >= num_tokens:
        raise ValueError(f"span starts {starts} must increase and lie inside {num_tokens} tokens")
    if any(b < a for a, b in zip(versions, versions[1:], strict=False)) or versions[0] < 0:
        raise ValueError(f"span versions {versions} must be non-negative and non-decreasing")
    bounds = starts[1:] + [num_tokens]
    return np.repeat(np.asarray(versions, dtype=np.int64), np.diff([0, *bounds]))


def _label(label, default: int | None) -> int:
    try:
        return int(label)
    except (TypeError, ValueError):
        if default is None:
            raise ValueError(f"weight version label {label!r} is not an integer") from None
        return default


def sampling_kwargs(params: SamplingParams, seed: int | None = None) -> dict:
    """vLLM ``SamplingParams`` keyword arguments for our sampling parameters."""
    return {
        "n": 1,
        "temperature": params.temperature,
        "top_p": params.top_p,
        # vLLM: -1 = off
        "top_k": params.top_k if params.top_k > 0 else -1,
        "max_tokens": params.max_new_tokens,
        "stop": list(params.stop) or None,
        "stop_token_ids": list(params.stop_token_ids) or None,
        # the tokens the learner trains on are the ones sampled
        "include_stop_str_in_output": True,
        # the sampled token's log-prob only
        "logprobs": 0,
        "seed": seed,
    }


def to_output(request_id: str, completion, version_at_start: int) -> Output:
    """A vLLM ``CompletionOutput`` -> our ``Output`` (behaviour log-probs and per-token versions)."""
    tokens = np.asarray(list(completion.token_ids), dtype=np.int32)
    if completion.logprobs is None or len(completion.logprobs) != len(tokens):
        raise ValueError(
            f"request {request_id}: vLLM returned no per-token log-probs; it needs SamplingParams(logprobs=0)"
        )
    logprobs = np.asarray(
        [step[int(token)].logprob for step, token in zip(completion.logprobs, tokens, strict=True)],
        dtype=np.float32,
    )
    spans = getattr(completion, "weight_versions", None)
    if spans:
        # labels that are not versions (before the first update) = the version at start
        versions = token_versions(spans, len(tokens), default=version_at_start).astype(np.int32)
    else:
        # no spans: the version the request started under
        versions = np.full(len(tokens), version_at_start, dtype=np.int32)
    finish = completion.finish_reason if completion.finish_reason in ("stop", "length") else "abort"
    return Output(request_id, tokens, logprobs, versions, finish)


def aborted_output(request_id: str) -> Output:
    """The output of a request aborted before its first token."""
    empty = np.zeros(0, np.int32), np.zeros(0, np.float32), np.zeros(0, np.int32)
    return Output(request_id, *empty, finish_reason="abort")
