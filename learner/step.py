"""One batch on one rank: ``updates_per_batch`` optimizer steps on the same micro-batches.

Every rank holds the whole batch and trains on its balanced share. Losses are
normalised by the totals of the whole batch (all ranks) and multiplied by the
world size, because DeepSpeed averages gradients over ranks: the summed
gradient is then exactly that of the full-batch loss, whatever the split.
Staleness is measured once, against the version the batch was taken at.

pi_prox (``proximal: recompute``) is the policy at the start of the batch: the
first update's forward pass runs on exactly those weights (the optimizer steps
only at the accumulation boundary), so its detached log-probs are pi_prox and no
separate no-grad pass is needed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from configs.schema import Config
from learner import algorithm
from learner.batching import MicroBatch, Sample, collate, masked_out, plan_rank_micro_batches
from learner.engine import mark_micro_batch, set_micro_batches, token_logprobs


@dataclass
class UpdateStats:
    """Whole-batch figures of one optimizer step (summed over ranks)."""

    loss: float
    tokens: int
    clip_fraction: float
    is_weight_mean: float
    is_truncated_fraction: float
    kl: float
    entropy: float
    grad_norm: float
    forward_backward_s: float = 0.0
    optimizer_s: float = 0.0


def counted_tokens(samples: list[Sample], version: int, max_staleness: int) -> tuple[int, int]:
    """(completion tokens not stale, sequences with at least one such token) over the whole batch."""
    tokens = seqs = 0
    for s in samples:
        fresh = int(((version - s.versions) <= max_staleness).sum())
        tokens += fresh
        seqs += fresh > 0
    return tokens, seqs


def loss_normalizer(cfg: Config, samples: list[Sample], version: int) -> float:
    tokens, seqs = counted_tokens(samples, version, cfg.algo.max_staleness)
    mode = cfg.algo.aggregation
    if mode == "token_mean":
        return float(max(tokens, 1))
    if mode == "seq_mean":
        return float(max(seqs, 1))
    return float(cfg.algo.constant_normalizer or cfg.rollout.max_new_tokens * len(samples))


def _rank_micro_batches(
    samples: list[Sample], cfg: Config, rank: int, world: int, pad_id: int
) -> list[MicroBatch]:
    mine, count = plan_rank_micro_batches(samples, world, rank, cfg.learner.micro_batch_tokens)
    batches = [collate(b, pad_id) for b in mine]
    filler = masked_out(batches[0] if batches else collate(samples[:1], pad_id))
    return batches + [filler] * (count - len(batches))


def _loss(
    cfg: Config, logprobs, entropy, mb: MicroBatch, version: int, prox, ref, normalizer: float
):
    a = cfg.algo
    staleness = algorithm.token_staleness(version, mb.versions)
    mask = mb.completion_mask & ~algorithm.stale_mask(staleness, a.max_staleness)
    clip_low, clip_high, rho = a.clip_low, a.clip_high, a.rho_max
    if a.staleness_tighten > 0:
        clip_low = algorithm.tighten(a.clip_low, staleness, a.staleness_tighten)
        clip_high = algorithm.tighten(a.clip_high, staleness, a.staleness_tighten)
        rho = algorithm.tighten(
            a.rho_max, staleness, a.staleness_tighten, floor=min(1.0, a.rho_max)
        )
    return algorithm.policy_loss(
        logprobs,
        mb.behaviour_logprobs,
        mb.advantages,
        mask,
        clip_low=clip_low,
        clip_high=clip_high,
        rho_max=rho,
        proximal_logprobs=prox,
        importance_correction=a.importance_correction,
        ref_logprobs=ref,
        kl_coef=a.kl_coef,
        entropy=entropy,
        entropy_coef=a.entropy_coef,
        aggregation=a.aggregation,
        normalizer=normalizer,
    )


@torch.no_grad()
def _logprobs_no_grad(model, batches: list[MicroBatch], temperature: float) -> list[torch.Tensor]:
    return [token_logprobs(model, mb, temperature) for mb in batches]


def _all_reduce_sum(values: list[float]) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t)
    return t.tolist()


def train_batch(
    engine,
    samples: list[Sample],
    version: int,
    cfg: Config,
    rank: int,
    world: int,
    pad_id: int,
    ref_model=None,
    after_update: Callable[[UpdateStats], None] | None = None,
    skipped: Sequence[Sample] = (),
) -> list[UpdateStats]:
    """Train on ``samples`` (the whole batch, identical on every rank); one ``UpdateStats`` per optimizer step.

    ``after_update`` runs after each optimizer step (rank 0 publishes the new version there).
    ``skipped`` are zero-advantage samples left out of the passes but counted by the loss normaliser.
    """
    batches = _rank_micro_batches(samples, cfg, rank, world, pad_id)
    temperature = cfg.rollout.temperature
    normalizer = loss_normalizer(cfg, [*samples, *skipped], version)
    need_prox = cfg.algo.importance_correction and cfg.algo.proximal == "recompute"
    prox: list[torch.Tensor | None] = [None] * len(batches)
    ref = (
        _logprobs_no_grad(ref_model, batches, temperature)
        if ref_model is not None and cfg.algo.kl_coef > 0
        else [None] * len(batches)
    )
    results = []
    for update in range(cfg.learner.updates_per_batch):
        set_micro_batches(engine, len(batches))
        # loss, tokens, clip, is_weight, truncated, kl, entropy (the last five token-weighted)
        sums = [0.0] * 7
        fb_s = opt_s = 0.0
        for i, (mb, r) in enumerate(zip(batches, ref, strict=True)):
            mark_micro_batch(engine, i, len(batches))
            t0 = time.perf_counter()
            logprobs, entropy = token_logprobs(engine, mb, temperature, with_entropy=True)
            if need_prox and update == 0:
                prox[i] = logprobs.detach()
            loss, st = _loss(cfg, logprobs, entropy, mb, version, prox[i], r, normalizer)
            engine.backward(loss * world, scale_wrt_gas=False)
            t1 = time.perf_counter()
            engine.step()
            opt_s += time.perf_counter() - t1
            fb_s += t1 - t0
            n = st.tokens
            for k, v in enumerate(
                (
                    float(loss.detach()),
                    n,
                    st.clip_fraction * n,
                    st.is_weight_mean * n,
                    st.is_truncated_fraction * n,
                    st.kl * n,
                    st.entropy * n,
                )
            ):
                sums[k] += v
        loss_sum, tokens, clip, weight, trunc, kl, ent = _all_reduce_sum(sums)
        denom = max(tokens, 1.0)
        grad_norm = engine.get_global_grad_norm()
        results.append(
            UpdateStats(
                loss=loss_sum,
                tokens=int(tokens),
                clip_fraction=clip / denom,
                is_weight_mean=weight / denom,
                is_truncated_fraction=trunc / denom,
                kl=kl / denom,
                entropy=ent / denom,
                grad_norm=float(grad_norm) if grad_norm is not None else 0.0,
                forward_backward_s=fb_s,
                optimizer_s=opt_s,
            )
        )
        if after_update is not None:
            after_update(results[-1])
    return results
