"""The supervised losses as pure functions of log-probs: SFT's token mean and DPO's pair losses.

SFT is the negative log-likelihood of the trained tokens, summed and divided by the trained
tokens of the whole optimizer step (every micro-batch and rank), so the step's loss is the
token mean over its batch whatever the packing and the split: the loss of transformers'
``labels`` on the same batch.

DPO compares, per pair, the policy's log-probability ratios to a frozen reference's:
``margin = (log pi(chosen) - log ref(chosen)) - (log pi(rejected) - log ref(rejected))``, each a sum
over the response tokens. ``sigmoid`` is DPO's ``-log sigmoid(beta * margin)``; ``ipo`` takes each
ratio as a mean over its response tokens and is ``(margin - 1 / (2 beta))^2`` (TRL's ``ipo``,
which its authors confirmed is the normalised form the IPO paper reports).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

DPO_LOSSES = ("sigmoid", "ipo")


def sft_loss(logprobs: Tensor, mask: Tensor, normalizer: float) -> Tensor:
    """``-sum(logprobs over mask) / normalizer`` (the step's trained tokens)."""
    return -(logprobs * mask).sum() / normalizer


def row_sums(logprobs: Tensor, mask: Tensor) -> Tensor:
    """[B] the log-probability of each row's trained tokens."""
    return (logprobs * mask).sum(-1)


def dpo_margin(
    chosen: Tensor,
    rejected: Tensor,
    ref_chosen: Tensor,
    ref_rejected: Tensor,
    loss: str,
    chosen_tokens: Tensor | None = None,
    rejected_tokens: Tensor | None = None,
) -> Tensor:
    """[N] the difference of the chosen and rejected log-ratios (per token for ``ipo``: the
    ``*_tokens`` counts are then required)."""
    chosen_ratio, rejected_ratio = chosen - ref_chosen, rejected - ref_rejected
    if loss == "ipo":
        if chosen_tokens is None or rejected_tokens is None:
            raise ValueError("ipo divides each log-ratio by its response tokens: pass the counts")
        chosen_ratio = chosen_ratio / chosen_tokens.clamp(min=1)
        rejected_ratio = rejected_ratio / rejected_tokens.clamp(min=1)
    return chosen_ratio - rejected_ratio


def dpo_losses(margin: Tensor, beta: float, loss: str) -> Tensor:
    """[N] the per-pair loss of ``margin`` (``dpo_margin``)."""
    if loss == "sigmoid":
        return -F.logsigmoid(beta * margin)
    if loss == "ipo":
        return (margin - 1 / (2 * beta)) ** 2
    raise ValueError(f"unknown DPO loss {loss!r}: one of {DPO_LOSSES}")


def implicit_rewards(policy: Tensor, reference: Tensor, beta: float) -> Tensor:
    """[N] DPO's implicit reward ``beta * (log pi - log ref)`` of responses (logged, never trained)."""
    with torch.no_grad():
        return beta * (policy - reference)
