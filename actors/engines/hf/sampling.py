"""Token sampling with the log-prob of the distribution actually sampled from.

Pure functions on logits. Order as in transformers and vLLM: temperature, then
top-k, then top-p on the temperature-scaled, top-k-filtered distribution, the
kept set found by ``policy.logprobs.kept_floor``, which the learner's scorer uses
too. The returned log-prob is taken from that final (renormalised) distribution,
which is what the learner's importance weights need as the behaviour policy.
"""

from __future__ import annotations

import torch

from streamrl.policy.logprobs import kept_floor


def processed_logprobs(
    logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0
) -> torch.Tensor:
    """[B, V] logits -> [B, V] log-probs of the sampling distribution; filtered tokens are -inf.
    Half-precision logits are sampled in float32, float64 ones (exactness tests) in float64."""
    scaled = (logits.float() if logits.dtype != torch.float64 else logits) / temperature
    if top_k > 0 or top_p < 1.0:
        scaled = scaled.masked_fill(scaled < kept_floor(scaled, top_k, top_p), float("-inf"))
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
