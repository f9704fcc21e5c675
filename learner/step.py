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

import functools
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields

import numpy as np
import torch
from torch import Tensor

from streamrl.broker.semantics import is_stale
from streamrl.configs.schema import AlgoConfig, LearnerConfig, RolloutConfig
from streamrl.learner import algorithm
from streamrl.learner.batching import MicroBatch, Sample, rank_micro_batches
from streamrl.learner.engine import (
    mark_micro_batch,
    set_micro_batches,
    sum_over_ranks,
    token_logprobs,
)
from streamrl.policy.logprobs import Sampling


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
    # the truncated IS weights' mean square (their ESS with ``is_weight_mean``) and KL(mu || pi_prox)
    is_weight_sq_mean: float
    behaviour_kl: float
    forward_backward_s: float = 0.0
    optimizer_s: float = 0.0
    # prompt + completion tokens of the samples trained (fillers of idle ranks not counted)
    sequence_tokens: int = 0
    # tokens the forward passes ran on: packed rows x their width, padding and fillers included
    packed_tokens: int = 0
    # which pass over the batch (0 = first) this step belongs to
    epoch: int = 0
    # the learning rate this optimizer step took (learner.lr_scheduler)
    lr: float = float("nan")


def first_pass_tokens(updates: Sequence[UpdateStats], field: str = "tokens") -> int:
    """Tokens (``field`` of ``UpdateStats``) the batch trained once: the first pass's
    mini-batches (later passes re-train them)."""
    return sum(getattr(u, field) for u in updates if u.epoch == 0)


def off_policy(updates: Sequence[UpdateStats]) -> dict[str, float]:
    """How far off-policy the batch was, over the tokens its first pass trained: the normalised
    effective sample size of the truncated IS weights (``is_ess``) and KL(mu || pi_prox)
    (``behaviour_kl``); NaN for a step that trained nothing."""
    first = [u for u in updates if u.epoch == 0 and u.tokens > 0]
    tokens = sum(u.tokens for u in first)
    if not tokens:
        return {"is_ess": math.nan, "behaviour_kl": math.nan}

    def mean(field: str) -> float:
        return sum(getattr(u, field) * u.tokens for u in first) / tokens

    return {
        "is_ess": algorithm.effective_sample_size(
            mean("is_weight_mean"), mean("is_weight_sq_mean")
        ),
        "behaviour_kl": mean("behaviour_kl"),
    }


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
    """(model-sampled completion tokens not stale, sequences with at least one such token) over the
    whole batch."""
    if not samples:
        return 0, 0
    fresh = np.concatenate([s.trained() for s in samples]) & ~is_stale(
        version, np.concatenate([s.versions for s in samples]), max_staleness
    )
    # one sum per sample over its run of the concatenation
    lengths = np.fromiter((len(s.versions) for s in samples), dtype=np.int64, count=len(samples))
    per_sample = np.add.reduceat(
        np.append(fresh, False).astype(np.int64), np.cumsum(lengths) - lengths
    )
    per_sample[lengths == 0] = 0
    return int(fresh.sum()), int((per_sample > 0).sum())


def loss_normalizer(
    algo: AlgoConfig,
    rollout: RolloutConfig,
    samples: list[Sample],
    version: int,
    completion_budget: int | None = None,
) -> float:
    """The loss's denominator for ``algo.aggregation``. ``completion_budget``: the most tokens one
    completion may hold, which ``constant`` scales by (None: ``rollout.max_new_tokens``; a
    multi-turn trajectory's is ``env.max_total_tokens``, an agent's ``agent.max_total_tokens``)."""
    tokens, seqs = counted_tokens(samples, version, algo.staleness_limit)
    mode = algo.aggregation
    if mode == "token_mean":
        return float(max(tokens, 1))
    if mode == "seq_mean":
        return float(max(seqs, 1))
    budget = rollout.max_new_tokens if completion_budget is None else completion_budget
    return float(algo.constant_normalizer or budget * len(samples))


@dataclass
class MiniBatch:
    """One mini-batch as this rank trains it, with what every pass over it reuses."""

    micro_batches: list[MicroBatch]
    # the loss's denominator: the whole mini-batch's (every rank, skipped samples included)
    normalizer: float
    # per micro-batch: the KL term's reference log-probs (None without one)
    ref_logprobs: list[Tensor | None]
    # per micro-batch: pi_prox (None until the first pass takes it, or with ``proximal: behaviour``)
    prox_logprobs: list[Tensor | None]


@dataclass
class UpdateSums:
    """What one optimizer step adds up over its micro-batches and then over ranks: the loss, the
    counted tokens, and the token-weighted sums of the per-token means of ``LossStats``."""

    loss: float = 0.0
    tokens: float = 0.0
    clip: float = 0.0
    is_weight: float = 0.0
    is_truncated: float = 0.0
    kl: float = 0.0
    entropy: float = 0.0
    is_weight_sq: float = 0.0
    behaviour_kl: float = 0.0
    sequence_tokens: float = 0.0
    packed_tokens: float = 0.0

    def add(self, loss: float, stats: algorithm.LossStats, mb: MicroBatch | None = None) -> None:
        """Add a micro-batch's loss and stats (and with ``mb``, its sequence and packed tokens)."""
        n = stats.tokens
        if mb is not None:
            self.sequence_tokens += mb.sequence_tokens
            self.packed_tokens += mb.packed_tokens
        self.loss += loss
        self.tokens += n
        self.clip += stats.clip_fraction * n
        self.is_weight += stats.is_weight_mean * n
        self.is_truncated += stats.is_truncated_fraction * n
        self.kl += stats.kl * n
        self.entropy += stats.entropy * n
        self.is_weight_sq += stats.is_weight_sq_mean * n
        self.behaviour_kl += stats.behaviour_kl * n

    def to_tensor(self) -> Tensor:
        """The sums as one float64 tensor (field order), so the ranks reduce them in one call."""
        return torch.tensor([getattr(self, f.name) for f in fields(self)], dtype=torch.float64)

    @classmethod
    def from_tensor(cls, values: Tensor) -> UpdateSums:
        return cls(*values.tolist())

    def stats(self, grad_norm: float, forward_backward_s: float, optimizer_s: float) -> UpdateStats:
        """The step's ``UpdateStats``: the loss and token count, the rest as per-token means."""
        denom = max(self.tokens, 1.0)
        return UpdateStats(
            loss=self.loss,
            tokens=int(self.tokens),
            clip_fraction=self.clip / denom,
            is_weight_mean=self.is_weight / denom,
            is_truncated_fraction=self.is_truncated / denom,
            kl=self.kl / denom,
            entropy=self.entropy / denom,
            grad_norm=grad_norm,
            is_weight_sq_mean=self.is_weight_sq / denom,
            behaviour_kl=self.behaviour_kl / denom,
            forward_backward_s=forward_backward_s,
            optimizer_s=optimizer_s,
            sequence_tokens=int(self.sequence_tokens),
            packed_tokens=int(self.packed_tokens),
        )


def _loss(
    algo: AlgoConfig, logprobs, entropy, mb: MicroBatch, version: int, prox, ref, normalizer: float
):
    a = algo
    mask = mb.completion_mask & ~is_stale(version, mb.versions, a.staleness_limit)
    clip_low, clip_high, rho = a.clip_low, a.clip_high, a.rho_max
    if a.importance_sampling_level == "sequence":
        clip_low, clip_high = a.sequence_clip_low, a.sequence_clip_high
    if a.staleness_tighten > 0:
        staleness = algorithm.token_staleness(version, mb.versions)
        clip_low = algorithm.tighten(clip_low, staleness, a.staleness_tighten)
        clip_high = algorithm.tighten(clip_high, staleness, a.staleness_tighten)
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
        importance_level=a.importance_sampling_level,
    )


def token_scorer(rollout: RolloutConfig, learner: LearnerConfig) -> Callable:
    """``token_logprobs`` under the actors' sampling distribution (temperature, top-k, top-p: so
    the ratio starts at 1, docs/guarantees.md "What mu is"), ``learner.logprob_chunk_tokens`` at a
    time; called as ``score(model, micro_batch, ...)``."""
    sampling = Sampling(rollout.temperature, rollout.top_k, rollout.top_p)
    return functools.partial(
        token_logprobs, sampling=sampling, chunk_tokens=learner.logprob_chunk_tokens
    )


def _policy_logprobs(model, mb: MicroBatch, score: Callable, algo: AlgoConfig):
    """The trained log-probs and the entropy: logged always, differentiated only when its bonus
    is in the loss (else its graph would hold [B, L, vocabulary] activations through the backward)."""
    return score(model, mb, with_entropy=True, entropy_grad=algo.entropy_coef > 0)


def _reference_logprobs(
    ref_model, batches: list[MicroBatch], kl_coef: float, score: Callable
) -> list:
    """The KL term's reference log-probs per micro-batch: the learner's own no-grad pass, the
    actors' (``algo.reference_on: actors``; the consumer dead-letters groups without them), or
    None with no KL term."""
    if kl_coef == 0:
        return [None] * len(batches)
    if ref_model is not None:
        return _logprobs_no_grad(ref_model, batches, score)
    return [mb.ref_logprobs for mb in batches]


@torch.no_grad()
def _logprobs_no_grad(model, batches: list[MicroBatch], score: Callable) -> list[torch.Tensor]:
    return [score(model, mb) for mb in batches]


def _all_reduce_sum(sums: UpdateSums) -> UpdateSums:
    return UpdateSums.from_tensor(sum_over_ranks(sums.to_tensor()))


def train_batch(
    engine,
    samples: list[Sample],
    version: int,
    *,
    algo: AlgoConfig,
    learner: LearnerConfig,
    rollout: RolloutConfig,
    seed: int,
    rank: int,
    world: int,
    pad_id: int,
    ref_model=None,
    after_update: Callable[[UpdateStats], None] | None = None,
    skipped: Sequence[Sample] = (),
    completion_budget: int | None = None,
) -> list[UpdateStats]:
    """Train on ``samples`` (the whole batch, identical on every rank); one ``UpdateStats`` per optimizer step.

    ``seed`` is the run's (``run.seed``): with the version it draws the mini-batch split.
    ``after_update`` runs after each optimizer step (rank 0 publishes the new version there).
    ``skipped`` are zero-advantage samples left out of the passes but counted by the loss normaliser;
    ``completion_budget``: see ``loss_normalizer``.
    """
    score = token_scorer(rollout, learner)
    device = next(engine.module.parameters()).device
    need_prox = algo.importance_correction and algo.proximal == "recompute"
    split = split_minibatches(
        samples, skipped, learner.minibatches, seed=minibatch_seed(seed, version)
    )
    # a mini-batch whose samples were all skipped has nothing to train (the same on every rank)
    minis: list[MiniBatch] = []
    for trained, left_out in split:
        if not trained:
            continue
        batches, _real = rank_micro_batches(
            trained, world, rank, learner.micro_batch_tokens, pad_id, device
        )
        minis.append(
            MiniBatch(
                micro_batches=batches,
                normalizer=loss_normalizer(
                    algo, rollout, [*trained, *left_out], version, completion_budget
                ),
                ref_logprobs=_reference_logprobs(ref_model, batches, algo.kl_coef, score),
                # mini-batch 0's first forward pass gives pi_prox; the others need it before any step
                prox_logprobs=_logprobs_no_grad(engine.module, batches, score)
                if need_prox and minis
                else [None] * len(batches),
            )
        )
    results = []
    for epoch in range(learner.updates_per_batch):
        for index, mini in enumerate(minis):
            stats = _update(
                engine,
                mini,
                version,
                algo,
                score,
                world,
                take_prox=need_prox and epoch == 0 and index == 0,
            )
            stats.epoch = epoch
            results.append(stats)
            if after_update is not None:
                after_update(stats)
    return results


def _update(
    engine,
    mini: MiniBatch,
    version: int,
    algo: AlgoConfig,
    score: Callable,
    world: int,
    take_prox: bool,
) -> UpdateStats:
    """One optimizer step on one mini-batch's micro-batches (``take_prox``: keep its log-probs as pi_prox)."""
    batches, prox = mini.micro_batches, mini.prox_logprobs
    set_micro_batches(engine, len(batches))
    # before engine.step, which moves the schedule on to the next step's
    lr = float(engine.get_lr()[0])
    sums = UpdateSums()
    fb_s = opt_s = 0.0
    for i, (mb, ref) in enumerate(zip(batches, mini.ref_logprobs, strict=True)):
        mark_micro_batch(engine, i, len(batches))
        t0 = time.perf_counter()
        logprobs, entropy = _policy_logprobs(engine, mb, score, algo)
        if take_prox:
            prox[i] = logprobs.detach()
        loss, st = _loss(algo, logprobs, entropy, mb, version, prox[i], ref, mini.normalizer)
        engine.backward(loss * world, scale_wrt_gas=False)
        t1 = time.perf_counter()
        engine.step()
        opt_s += time.perf_counter() - t1
        fb_s += t1 - t0
        sums.add(float(loss.detach()), st, mb)
    grad_norm = engine.get_global_grad_norm()
    stats = _all_reduce_sum(sums).stats(
        grad_norm=float(grad_norm) if grad_norm is not None else 0.0,
        forward_backward_s=fb_s,
        optimizer_s=opt_s,
    )
    stats.lr = lr
    return stats
