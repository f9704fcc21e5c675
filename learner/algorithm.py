"""The RL math: pure functions over tensors and plain numbers (no config, no logging).

Shapes: ``N`` groups of ``G`` completions; ``B`` sequences of ``T`` target
positions. Per-token tensors are aligned with the sampled tokens; ``mask``
is True where a token counts (a completion token, not padding, not stale).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

ADVANTAGE_MODES = ("grpo", "drgrpo")
AGGREGATIONS = ("token_mean", "seq_mean", "constant")
IMPORTANCE_LEVELS = ("token", "sequence")


def group_advantages(
    rewards: Tensor, mode: str, eps: float, std_threshold: float
) -> tuple[Tensor, Tensor]:
    """rewards [N, G] -> (advantages [N, G], zero_variance [N] bool).

    ``zero_variance`` marks groups whose rewards are all equal (no learning
    signal); their advantages are 0 and the caller decides to skip and count them.
    The std is the population std over the G completions of one prompt.
    """
    if mode not in ADVANTAGE_MODES:
        raise ValueError(f"unknown advantage mode {mode!r}; expected one of {ADVANTAGE_MODES}")
    if rewards.dim() != 2 or rewards.shape[1] == 0:
        raise ValueError(f"rewards must be [N, G] with G >= 1, got shape {tuple(rewards.shape)}")
    rewards = rewards.to(torch.float64)
    mean = rewards.mean(dim=-1, keepdim=True)
    # r - mean(r)
    centred = rewards - mean
    if mode == "drgrpo":
        advantages = centred
    else:
        std = rewards.std(dim=-1, unbiased=False, keepdim=True)
        # A = (r - mean) / (std + eps); a group with std < threshold falls back to A = r - mean
        advantages = torch.where(std < std_threshold, centred, centred / (std + eps))
    zero_variance = rewards.amax(dim=-1) == rewards.amin(dim=-1)
    return advantages, zero_variance


def token_staleness(learner_version: int, token_versions: Tensor) -> Tensor:
    """Versions between the learner now and the policy that sampled each token."""
    # s_t = v_learner - v_t
    return learner_version - token_versions


def tighten(value: float, staleness: Tensor, rate: float, floor: float = 0.0) -> Tensor:
    """Shrink ``value`` towards ``floor`` by ``rate`` per version of staleness (clip ranges: floor 0; rho: floor 1).

    ``rate = 0`` returns ``value`` everywhere.
    """
    # x_s = floor + (x - floor) * max(0, 1 - rate * s)
    factor = (1.0 - rate * staleness.to(torch.float32)).clamp(min=0.0)
    return floor + (value - floor) * factor


def k3_kl(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Per-token k3 estimator of KL(pi_theta || pi_ref) (Schulman), >= 0."""
    log_ratio = ref_logprobs - logprobs
    # k3 = exp(ref - theta) - (ref - theta) - 1
    return torch.exp(log_ratio) - log_ratio - 1.0


def aggregate(
    per_token: Tensor, mask: Tensor, mode: str, normalizer: float | None = None
) -> Tensor:
    """Reduce a per-token loss [B, T] to a scalar; masked positions never contribute.

    token_mean: sum / (number of counted tokens); seq_mean: mean over sequences of
    each sequence's token mean; constant: sum / normalizer (Dr.GRPO). ``normalizer``
    overrides the denominator (token count, sequence count or the constant) so that
    the losses of several micro-batches add up to the loss of the whole batch.
    """
    if mode not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {mode!r}; expected one of {AGGREGATIONS}")
    mask_f = mask.to(per_token.dtype)
    masked = torch.where(mask, per_token, torch.zeros_like(per_token))
    if mode == "token_mean":
        denom = normalizer if normalizer is not None else mask_f.sum().clamp(min=1.0)
        # L = sum_t l_t m_t / sum_t m_t
        return masked.sum() / denom
    if mode == "seq_mean":
        tokens_per_seq = mask_f.sum(dim=-1)
        # L_i = sum_t l_it m_it / sum_t m_it  (0 for a sequence with no counted token)
        seq_loss = masked.sum(dim=-1) / tokens_per_seq.clamp(min=1.0)
        denom = (
            normalizer
            if normalizer is not None
            else (tokens_per_seq > 0).sum().clamp(min=1).to(per_token.dtype)
        )
        return seq_loss.sum() / denom
    if normalizer is None or normalizer <= 0:
        raise ValueError("aggregation 'constant' needs a positive normalizer")
    # L = sum_t l_t m_t / C
    return masked.sum() / normalizer


@dataclass
class LossStats:
    """Means over the counted tokens of one call; ``tokens`` weights them when micro-batches are combined."""

    tokens: int
    clip_fraction: float
    is_weight_mean: float
    is_truncated_fraction: float
    kl: float
    # mean policy entropy (nats) when the caller passed it
    entropy: float = math.nan
    # mean squared IS weight: with ``is_weight_mean`` the weights' effective sample size
    # (``effective_sample_size``), whatever the micro-batches they are combined over
    is_weight_sq_mean: float = 1.0
    # KL(mu || pi_prox) per token, the k3 estimate on tokens sampled from mu: how far the
    # policy moved while the data waited (0 without proximal log-probs)
    behaviour_kl: float = 0.0


def effective_sample_size(weight_mean: float, weight_sq_mean: float) -> float:
    """Normalised ESS of importance weights, (sum w)^2 / (n sum w^2) = mean(w)^2 / mean(w^2), in
    (0, 1]: 1 when every weight is equal (on-policy), near 1/n when one token carries the batch."""
    if not weight_sq_mean > 0:
        return math.nan
    return weight_mean**2 / weight_sq_mean


def policy_loss(
    logprobs: Tensor,
    behaviour_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float | Tensor,
    clip_high: float | Tensor,
    rho_max: float | Tensor,
    proximal_logprobs: Tensor | None = None,
    importance_correction: bool = True,
    ref_logprobs: Tensor | None = None,
    kl_coef: float = 0.0,
    entropy: Tensor | None = None,
    entropy_coef: float = 0.0,
    aggregation: str = "token_mean",
    normalizer: float | None = None,
    importance_level: str = "token",
) -> tuple[Tensor, LossStats]:
    """Decoupled, staleness-aware PPO loss (docs/architecture.md, "Loss").

    logprobs: pi_theta [B, T] (with grad); behaviour_logprobs: mu [B, T];
    proximal_logprobs: pi_prox [B, T] or None (= mu stands in, ``proximal: behaviour``);
    advantages: [B] or [B, T]; mask: [B, T] bool; clip_low/clip_high/rho_max: numbers
    or per-token [B, T] (staleness tightening). ``importance_correction=False`` is the
    plain PPO ratio against mu with no IS weight. ``kl`` in the stats is the k3 KL to
    the reference when one is given, else to the behaviour policy (drift). ``entropy``
    [B, T] is the policy's per-position entropy (with grad when ``entropy_coef`` > 0, which subtracts
    it from each token's loss), a bonus that keeps a policy from collapsing onto one answer
    before it has found the right one.

    ``importance_level="sequence"`` is GSPO (Zheng et al. 2025, TRL's
    ``importance_sampling_level``): every token of a sequence shares one ratio, the geometric
    mean exp(mean_t (pi_theta - pi_prox)) over its counted tokens, clipped at the sequence's
    tightest per-token bounds; the truncated weight and the KL stay per token.
    """
    if importance_level not in IMPORTANCE_LEVELS:
        raise ValueError(
            f"unknown importance level {importance_level!r}; expected one of {IMPORTANCE_LEVELS}"
        )
    if advantages.dim() == 1:
        advantages = advantages[:, None].expand_as(logprobs)
    advantages = advantages.to(logprobs.dtype)
    zero = torch.zeros_like(logprobs)
    theta = _masked(logprobs, mask, zero)
    mu = _masked(behaviour_logprobs, mask, zero)
    if importance_correction:
        prox = mu if proximal_logprobs is None else _masked(proximal_logprobs, mask, zero)
        weight, truncated = _importance_weights(prox, mu, rho_max)
    else:
        # plain PPO: the ratio is against mu and nothing reweights it
        prox, weight, truncated = mu, torch.ones_like(logprobs), torch.zeros_like(mask)
    if importance_level == "sequence":
        ratio, clipped_ratio = _sequence_ratios(theta, prox, mask, clip_low, clip_high)
    else:
        ratio, clipped_ratio = _ratios(theta, prox, clip_low, clip_high)
    surrogate, clipped_surrogate = ratio * advantages, clipped_ratio * advantages
    # l_t = -w * min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)
    per_token = -weight * torch.minimum(surrogate, clipped_surrogate)
    kl_target = ref_logprobs if ref_logprobs is not None else behaviour_logprobs
    kl = k3_kl(theta, _masked(kl_target, mask, zero))
    if entropy is not None:
        if entropy_coef > 0 and logprobs.requires_grad and not entropy.requires_grad:
            raise ValueError("entropy_coef > 0 needs the entropy with its gradient")
        entropy = _masked(entropy, mask, zero)
    # the KL to the behaviour policy only measures drift: it is never a penalty
    kl_penalty = kl_coef if ref_logprobs is not None else 0.0
    per_token = _regularised(per_token, kl, kl_penalty, entropy, entropy_coef)
    loss = aggregate(per_token, mask, aggregation, normalizer)
    # the drift of the data: measured against pi_prox whenever the caller has it
    drift_to = prox if proximal_logprobs is None else _masked(proximal_logprobs, mask, zero)
    stats = _loss_stats(
        mask, surrogate > clipped_surrogate, weight, truncated, kl, entropy, k3_kl(mu, drift_to)
    )
    return loss, stats


def _masked(values: Tensor, mask: Tensor, zero: Tensor) -> Tensor:
    """``values`` in ``zero``'s dtype where ``mask`` holds, 0 elsewhere."""
    # padded/stale positions may hold anything (even -inf): zero them before exp
    return torch.where(mask, values.to(zero.dtype), zero)


def _importance_weights(prox: Tensor, mu: Tensor, rho_max: float | Tensor) -> tuple[Tensor, Tensor]:
    """(IS weight [B, T] without gradient, where the raw weight was truncated at ``rho_max``)."""
    raw_weight = torch.exp(prox - mu)
    # w = min(exp(pi_prox - mu), rho_bar), no gradient
    weight = torch.minimum(
        raw_weight, torch.as_tensor(rho_max, dtype=mu.dtype, device=mu.device)
    ).detach()
    return weight, raw_weight > rho_max


def _ratios(
    theta: Tensor, prox: Tensor, clip_low: float | Tensor, clip_high: float | Tensor
) -> tuple[Tensor, Tensor]:
    """(ratio of pi_theta to pi_prox [B, T] with grad through pi_theta only, the same clipped)."""
    # r = exp(pi_theta - pi_prox)
    ratio = torch.exp(theta - prox.detach())
    # on the loss's device: a 0-dim CPU bound next to CUDA log-probs fails torch.clamp
    low = torch.as_tensor(clip_low, dtype=theta.dtype, device=theta.device)
    high = torch.as_tensor(clip_high, dtype=theta.dtype, device=theta.device)
    return ratio, torch.clamp(ratio, 1.0 - low, 1.0 + high)


def _sequence_ratios(
    theta: Tensor,
    prox: Tensor,
    mask: Tensor,
    clip_low: float | Tensor,
    clip_high: float | Tensor,
) -> tuple[Tensor, Tensor]:
    """GSPO's ratio: one per sequence, expanded over its [B, T] tokens, and the same clipped.

    Its gradient reaches each token's pi_theta through the mean, which is the GSPO paper's
    stop-gradient form sg[s_i] * pi_theta(y_t) / sg[pi_theta(y_t)] averaged over the tokens.
    """
    counted = mask.to(theta.dtype)
    tokens = counted.sum(dim=-1).clamp(min=1.0)
    # log s_i = sum_t m_t (pi_theta - pi_prox) / sum_t m_t
    log_ratio = ((theta - prox.detach()) * counted).sum(dim=-1) / tokens
    ratio = torch.exp(log_ratio)[:, None].expand_as(theta)
    low, high = _sequence_bound(clip_low, mask, theta), _sequence_bound(clip_high, mask, theta)
    return ratio, torch.clamp(ratio, 1.0 - low, 1.0 + high)


def _sequence_bound(bound: float | Tensor, mask: Tensor, like: Tensor) -> Tensor:
    """A clip range per sequence [B, 1]: a per-token (staleness-tightened) bound's smallest
    value over the counted tokens, the tightest the sequence's stalest token allows."""
    bound = torch.as_tensor(bound, dtype=like.dtype, device=like.device)
    if bound.dim() == 0:
        return bound.expand(like.shape[0], 1)
    spare = torch.full_like(bound, math.inf)
    tightest = torch.where(mask, bound, spare).amin(dim=-1, keepdim=True)
    # a sequence with no counted token has no loss; any finite bound does
    return torch.where(torch.isinf(tightest), torch.zeros_like(tightest), tightest)


def _regularised(
    per_token: Tensor, kl: Tensor, kl_coef: float, entropy: Tensor | None, entropy_coef: float
) -> Tensor:
    """The per-token loss with the KL penalty added and the entropy bonus taken off."""
    if kl_coef > 0:
        # l_t += beta * k3
        per_token = per_token + kl_coef * kl
    if entropy is not None and entropy_coef > 0:
        # l_t -= c * H_t
        per_token = per_token - entropy_coef * entropy
    return per_token


@torch.no_grad()
def _loss_stats(
    mask: Tensor,
    clipped: Tensor,
    weight: Tensor,
    truncated: Tensor,
    kl: Tensor,
    entropy: Tensor | None,
    behaviour_kl: Tensor,
) -> LossStats:
    """Means over the counted tokens; ``entropy`` comes already masked."""
    count = int(mask.sum())
    denom = max(count, 1)
    zero = torch.zeros_like(weight)
    return LossStats(
        tokens=count,
        clip_fraction=float((clipped & mask).sum()) / denom,
        is_weight_mean=float(torch.where(mask, weight, zero).sum()) / denom,
        is_truncated_fraction=float((truncated & mask).sum()) / denom,
        kl=float(torch.where(mask, kl, zero).sum()) / denom,
        entropy=math.nan if entropy is None else float(entropy.sum()) / denom,
        is_weight_sq_mean=float(torch.where(mask, weight.square(), zero).sum()) / denom,
        behaviour_kl=float(torch.where(mask, behaviour_kl, zero).sum()) / denom,
    )
