"""A supervised step's examples as this rank's micro-batches, and the order the steps take them in.

The RL learner's packing serves both: SFT examples are ``Sample``s packed under
``learner.micro_batch_tokens``; a DPO pair's two responses always share a micro-batch (its loss
needs both sums), so pairs are shared out across ranks and grouped whole, as many to a
micro-batch as its packed rows fit. Every rank runs the same number of micro-batches (ZeRO-2
reduces gradients in every backward); a rank with fewer runs fully masked fillers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from streamrl.learner.batching import (
    MicroBatch,
    Sample,
    collate,
    pack_micro_batches,
    partition_across_ranks,
    with_fillers,
)

Pair = tuple[Sample, Sample]


def steps_per_epoch(examples: int, batch_size: int) -> int:
    """Optimizer steps of one pass (the last batch may be smaller)."""
    return math.ceil(examples / batch_size)


def step_indices(examples: int, batch_size: int, step: int, seed: int, shuffle: bool) -> list[int]:
    """The examples of optimizer step ``step`` (0-based): its slice of its epoch's order, which
    ``seed`` and the epoch draw (the same on every rank and after a resume)."""
    per_epoch = steps_per_epoch(examples, batch_size)
    epoch, index = divmod(step, per_epoch)
    order = (
        np.random.default_rng([seed, epoch]).permutation(examples)
        if shuffle
        else np.arange(examples)
    )
    return order[index * batch_size : (index + 1) * batch_size].tolist()


def _pair_len(pair: Pair) -> int:
    return len(pair[0]) + len(pair[1])


def _flat(pairs: Sequence[Pair]) -> list[Sample]:
    """chosen_0, rejected_0, chosen_1, ...: ``collate`` keeps this order in its sample layout."""
    return [s for pair in pairs for s in pair]


def group_pairs(pairs: Sequence[Pair], budget: int) -> list[list[Pair]]:
    """Runs of pairs (longest first) whose responses pack into one micro-batch under ``budget``;
    a pair that fits nowhere gets one of its own."""
    groups: list[list[Pair]] = []
    current: list[Pair] = []
    for pair in sorted(pairs, key=_pair_len, reverse=True):
        if current and len(pack_micro_batches(_flat([*current, pair]), budget)) > 1:
            groups.append(current)
            current = []
        current.append(pair)
    if current:
        groups.append(current)
    return groups


def pair_micro_batches(
    pairs: list[Pair], world: int, rank: int, budget: int, pad_id: int, device
) -> tuple[list[MicroBatch], int]:
    """This rank's micro-batches of whole pairs (rows 2i and 2i + 1: chosen and rejected of pair
    i), fillers included, and how many of them are real."""
    per_rank = [
        group_pairs(share, budget) for share in partition_across_ranks(pairs, world, _pair_len)
    ]
    batches = [collate(_flat(g), pad_id, budget).to(device) for g in per_rank[rank]]
    count = max(len(groups) for groups in per_rank)
    return with_fillers(batches, count, list(pairs[0]), pad_id, budget, device)


def trained_tokens(samples: Sequence[Sample]) -> int:
    return int(sum(int(s.trained().sum()) for s in samples))
