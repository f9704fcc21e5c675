"""One batch on one rank: ``updates_per_batch`` passes, each of ``minibatches`` optimizer steps.

The batch is split once into ``minibatches`` disjoint random mini-batches (PPO
style: the reference loop's two updates per rollout are two halves, not two
passes over the whole); every pass takes one optimizer step per mini-batch.
Every rank holds the whole batch and trains on its balanced share of each
mini-batch. Losses are normalised by the totals of the whole mini-batch (all
ranks) and multiplied by the world size, because DeepSpeed averages gradients
over ranks: the summed gradient is then exactly that of the mini-batch loss,
whatever the split. Staleness is measured once, against the version the batch
was taken at.

pi_prox (``proximal: recompute``) is the policy at the start of the batch, for
every mini-batch: the first mini-batch's forward pass runs on exactly those
weights (the optimizer steps only at the accumulation boundary), so its detached
log-probs are pi_prox; the other mini-batches get a no-grad pass before the
first step.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from streamrl.broker.semantics import is_stale
from streamrl.configs.schema import Config
from streamrl.learner import algorithm
from streamrl.learner.batching import (
    MicroBatch,
    Sample,
    collate,
    masked_out,
    plan_rank_micro_batches,
)
from streamrl.learner.engine import mark_micro_batch, set_micro_batches, token_logprobs


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
    # which pass over the batch (0 = first) this step belongs to
    epoch: int = 0


def first_pass_tokens(updates: Sequence[UpdateStats]) -> int:
    """Tokens the batch trained once: the first pass's mini-batches (later passes re-train them)."""
    return sum(u.tokens for u in updates if u.epoch == 0)


def minibatch_seed(run_seed: int, version: int) -> int:
    return run_seed * 1_000_003 + version


def minibatch_indices(size: int, count: int, seed: int) -> list[list[int]]:
    """``count`` disjoint random index sets covering ``range(size)`` (sizes differ by at most one).

    ``seed`` makes every rank draw the same split.
    """
    order = list(range(size))
    random.Random(seed).shuffle(order)
    return [order[i::count] for i in range(count)]


def split_minibatches(
    samples: Sequence[Sample], skipped: Sequence[Sample], count: int, seed: int
) -> list[tuple[list[Sample], list[Sample]]]:
    """(trained, skipped) samples of each mini-batch of ``minibatch_indices`` over samples + skipped.

    Skipped (zero-advantage) samples are dealt out with the others, so each
    mini-batch's loss normaliser counts its own share of them.
    """
    every = [*samples, *skipped]
    trained = len(samples)
    return [
        ([every[i] for i in idx if i < trained], [every[i] for i in idx if i >= trained])
        for idx in minibatch_indices(len(every), count, seed)
    ]


def counted_tokens(samples: list[Sample], version: int, max_staleness: int) -> tuple[int, int]:
    """(completion tokens not stale, sequences with at least one such token) over the whole batch."""
    tokens = seqs = 0
    for s in samples:
        fresh = int((~is_stale(version, s.versions, max_staleness)).sum())
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
    samples: list[Sample], cfg: Config, rank: int, world: int, pad_id: int, device: torch.device
) -> list[MicroBatch]:
    mine, count = plan_rank_micro_batches(samples, world, rank, cfg.learner.micro_batch_tokens)
    batches = [collate(b, pad_id).to(device) for b in mine]
    filler = masked_out(batches[0] if batches else collate(samples[:1], pad_id).to(device))
    return batches + [filler] * (count - len(batches))


def _loss(
    cfg: Config, logprobs, entropy, mb: MicroBatch, version: int, prox, ref, normalizer: float
):
    a = cfg.algo
    mask = mb.completion_mask & ~is_stale(version, mb.versions, a.max_staleness)
    clip_low, clip_high, rho = a.clip_low, a.clip_high, a.rho_max
    if a.staleness_tighten > 0:
        staleness = algorithm.token_staleness(version, mb.versions)
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


def _reference_logprobs(ref_model, batches: list[MicroBatch], cfg: Config) -> list:
    """The KL term's reference log-probs per micro-batch: the learner's own no-grad pass, the
    actors' (``algo.reference_on: actors``; the consumer dead-letters groups without them), or
    None with no KL term."""
    if cfg.algo.kl_coef == 0:
        return [None] * len(batches)
    if ref_model is not None:
        return _logprobs_no_grad(ref_model, batches, cfg.rollout.temperature)
    return [mb.ref_logprobs for mb in batches]


@torch.no_grad()
def _logprobs_no_grad(model, batches: list[MicroBatch], temperature: float) -> list[torch.Tensor]:
    return [token_logprobs(model, mb, temperature) for mb in batches]


def _all_reduce_sum(values: list[float]) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64)
    if dist.is_initialized() and dist.get_world_size() > 1:
        # NCCL reduces only tensors on the rank's GPU
        if dist.get_backend() == "nccl":
            t = t.to(torch.device("cuda", torch.cuda.current_device()))
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
    temperature = cfg.rollout.temperature
    device = next(engine.module.parameters()).device
    need_prox = cfg.algo.importance_correction and cfg.algo.proximal == "recompute"
    split = split_minibatches(
        samples, skipped, cfg.learner.minibatches, seed=minibatch_seed(cfg.run.seed, version)
    )
    # a mini-batch whose samples were all skipped has nothing to train (the same on every rank)
    minis = []
    for trained, left_out in split:
        if not trained:
            continue
        batches = _rank_micro_batches(trained, cfg, rank, world, pad_id, device)
        minis.append(
            {
                "batches": batches,
                "normalizer": loss_normalizer(cfg, [*trained, *left_out], version),
                "ref": _reference_logprobs(ref_model, batches, cfg),
                # mini-batch 0's first forward pass gives pi_prox; the others need it before any step
                "prox": _logprobs_no_grad(engine.module, batches, temperature)
                if need_prox and minis
                else [None] * len(batches),
            }
        )
    results = []
    for epoch in range(cfg.learner.updates_per_batch):
        for index, mini in enumerate(minis):
            stats = _update(
                engine, mini, version, cfg, world, need_prox and epoch == 0 and index == 0
            )
            stats.epoch = epoch
            results.append(stats)
            if after_update is not None:
                after_update(stats)
    return results


def _update(
    engine, mini: dict, version: int, cfg: Config, world: int, take_prox: bool
) -> UpdateStats:
    """One optimizer step on one mini-batch's micro-batches (``take_prox``: keep its log-probs as pi_prox)."""
    batches, prox, ref = mini["batches"], mini["prox"], mini["ref"]
    temperature = cfg.rollout.temperature
    set_micro_batches(engine, len(batches))
    # loss, tokens, clip, is_weight, truncated, kl, entropy (the last five token-weighted)
    sums = [0.0] * 7
    fb_s = opt_s = 0.0
    for i, (mb, r) in enumerate(zip(batches, ref, strict=True)):
        mark_micro_batch(engine, i, len(batches))
        t0 = time.perf_counter()
        logprobs, entropy = token_logprobs(engine, mb, temperature, with_entropy=True)
        if take_prox:
            prox[i] = logprobs.detach()
        loss, st = _loss(cfg, logprobs, entropy, mb, version, prox[i], r, mini["normalizer"])
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
    return UpdateStats(
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
