"""From decoded rollout groups to padded training tensors.

A ``Sample`` is one completion with its prompt; samples are shared out across
ranks with balanced token counts (longest first, to the lightest rank), then
packed into micro-batches under a token budget (padded tokens count; a
sample is never split), then collated into right-padded tensors with masks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from broker.wire import RolloutGroup


@dataclass
class Sample:
    input_ids: np.ndarray  # [P + C] int64: prompt then completion tokens
    prompt_len: int
    behaviour_logprobs: np.ndarray  # [C] float32
    versions: np.ndarray  # [C] int64, policy version per completion token
    advantage: float
    reward: float
    group_id: str

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def completion_len(self) -> int:
        return len(self) - self.prompt_len


def samples_from_group(group: RolloutGroup, advantages) -> list[Sample]:
    """One sample per completion; ``advantages`` holds one number per completion."""
    if len(advantages) != len(group.completions):
        raise ValueError(
            f"group {group.group_id}: {len(advantages)} advantages for {len(group.completions)} completions"
        )
    prompt = np.asarray(group.prompt_token_ids, dtype=np.int64)
    return [
        Sample(
            input_ids=np.concatenate([prompt, np.asarray(c.token_ids, dtype=np.int64)]),
            prompt_len=int(prompt.shape[0]),
            behaviour_logprobs=np.array(
                c.logprobs, dtype=np.float32
            ),  # a writable copy of the wire buffer
            versions=np.array(c.versions, dtype=np.int64),
            advantage=float(adv),
            reward=float(c.reward),
            group_id=group.group_id,
        )
        for c, adv in zip(group.completions, advantages, strict=True)
    ]


def partition_across_ranks(samples: list[Sample], world_size: int) -> list[list[Sample]]:
    """Balanced shares: longest sample first, each to the rank with the fewest tokens so far (ties: lowest rank)."""
    shares: list[list[Sample]] = [[] for _ in range(world_size)]
    loads = [0] * world_size
    for sample in sorted(samples, key=len, reverse=True):
        rank = min(range(world_size), key=lambda r: (loads[r], r))
        shares[rank].append(sample)
        loads[rank] += len(sample)
    return shares


def pack_micro_batches(samples: list[Sample], token_budget: int) -> list[list[Sample]]:
    """Consecutive runs of length-sorted samples whose padded size (rows x longest) fits the budget.

    A sample longer than the budget gets a micro-batch of its own.
    """
    batches: list[list[Sample]] = []
    current: list[Sample] = []
    longest = 0
    for sample in sorted(samples, key=len, reverse=True):
        padded = max(longest, len(sample)) * (len(current) + 1)
        if current and padded > token_budget:
            batches.append(current)
            current, longest = [], 0
        current.append(sample)
        longest = max(longest, len(sample))
    if current:
        batches.append(current)
    return batches


@dataclass
class MicroBatch:
    """Right-padded tensors. Target position t predicts ``input_ids[:, t + 1]``."""

    input_ids: Tensor  # [B, L] int64
    attention_mask: Tensor  # [B, L] int64
    completion_mask: (
        Tensor  # [B, L - 1] bool: target is a completion token (not prompt, not padding)
    )
    behaviour_logprobs: Tensor  # [B, L - 1] float32, 0 outside the completion
    versions: Tensor  # [B, L - 1] int64, -1 outside the completion
    advantages: Tensor  # [B] float32

    @property
    def num_tokens(self) -> int:
        return int(self.completion_mask.sum())


def collate(samples: list[Sample], pad_id: int) -> MicroBatch:
    if not samples:
        raise ValueError("cannot collate an empty micro-batch")
    rows, width = len(samples), max(len(s) for s in samples)
    input_ids = torch.full((rows, width), pad_id, dtype=torch.int64)
    attention_mask = torch.zeros((rows, width), dtype=torch.int64)
    completion_mask = torch.zeros((rows, width - 1), dtype=torch.bool)
    behaviour = torch.zeros((rows, width - 1), dtype=torch.float32)
    versions = torch.full((rows, width - 1), -1, dtype=torch.int64)
    for i, s in enumerate(samples):
        n, p = len(s), s.prompt_len
        input_ids[i, :n] = torch.from_numpy(s.input_ids)
        attention_mask[i, :n] = 1
        # completion token k sits at input position p + k, so its target position is p + k - 1
        completion_mask[i, p - 1 : n - 1] = True
        behaviour[i, p - 1 : n - 1] = torch.from_numpy(s.behaviour_logprobs)
        versions[i, p - 1 : n - 1] = torch.from_numpy(s.versions)
    advantages = torch.tensor([s.advantage for s in samples], dtype=torch.float32)
    return MicroBatch(input_ids, attention_mask, completion_mask, behaviour, versions, advantages)


def plan_rank_micro_batches(
    samples: list[Sample], world_size: int, rank: int, token_budget: int
) -> tuple[list[list[Sample]], int]:
    """This rank's micro-batches and the count every rank must run.

    ZeRO-2 reduces gradients in every backward, so all ranks run the same number
    of micro-batches; a rank with fewer pads with fully masked copies (see ``masked_out``).
    """
    per_rank = [
        pack_micro_batches(share, token_budget)
        for share in partition_across_ranks(samples, world_size)
    ]
    return per_rank[rank], max(len(b) for b in per_rank)


def masked_out(batch: MicroBatch) -> MicroBatch:
    """The same tensors with nothing counted: a filler micro-batch that contributes zero gradient."""
    return MicroBatch(
        batch.input_ids,
        batch.attention_mask,
        torch.zeros_like(batch.completion_mask),
        batch.behaviour_logprobs,
        batch.versions,
        batch.advantages,
    )
