"""Token sampling with the log-prob of the distribution actually sampled from.

Pure functions on logits. Order as in transformers and vLLM: temperature, then
top-k, then top-p on the temperature-scaled, top-k-filtered distribution. The
returned log-prob is taken from that final (renormalised) distribution, which
is what the learner's importance weights need as the behaviour policy.
"""

from __future__ import annotations

import torch


def processed_logprobs(
    logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0
) -> torch.Tensor:
    """[B, V] logits -> [B, V] log-probs of the sampling distribution; filtered tokens are -inf."""
    scaled = logits.float() / temperature
    vocab = scaled.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(scaled, top_k, dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(scaled, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # drop a token when the mass strictly before it already reaches top_p (the top token always stays)
        drop_sorted = (torch.cumsum(probs, dim=-1) - probs) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scaled = scaled.masked_fill(drop, float("-inf"))
    return torch.log_softmax(scaled, dim=-1)


def sample(
    logits: torch.Tensor,
    temperature: float,
    top_k: int = 0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row. Returns (token ids [B], their log-probs [B])."""
    logprobs = processed_logprobs(logits, temperature, top_k, top_p)
    tokens = torch.multinomial(logprobs.exp(), 1, generator=generator)
    return tokens.squeeze(-1), logprobs.gather(-1, tokens).squeeze(-1)
