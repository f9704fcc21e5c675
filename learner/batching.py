"""From decoded rollout groups to packed training tensors.

A ``Sample`` is one completion with its prompt; samples are shared out across
ranks with balanced token counts (longest first, to the lightest rank), then
packed into micro-batches under a token budget, then collated.

The model runs on packed rows: a micro-batch's samples, longest first, are
placed best-fit into rows as wide as its longest sample (at least ``MIN_ROW_WIDTH``), several short samples
end to end in one row, each with its own position ids (0, 1, ...). Given
position ids and no attention mask, transformers attends only within each
sample (its packed-sequence masks), so a forward pass costs the real tokens plus
the rows' leftover tails, not rows x the longest. The budget counts those packed
rows x their width; a sample is never split. The loss side stays in the sample
layout (one right-padded row per sample), into which the packed log-probs are
gathered back, so the RL math never sees the packing.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from typing import TypeVar

import numpy as np
import torch
from torch import Tensor

from streamrl.broker.wire import RolloutGroup

T = TypeVar("T")


@dataclass
class Sample:
    input_ids: np.ndarray  # [P + C] int64: prompt then completion tokens
    prompt_len: int
    behaviour_logprobs: np.ndarray  # [C] float32
    versions: np.ndarray  # [C] int64, policy version per completion token
    advantage: float
    reward: float
    group_id: str
    # [C] float32, the reference policy's log-probs as the actor sent them (algo.reference_on:
    # actors), else None
    ref_logprobs: np.ndarray | None = None
    # [C] bool, False at the tokens a multi-turn environment appended (never trained); None = all
    loss_mask: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def trained(self) -> np.ndarray:
        """[C] bool: the completion tokens the model sampled, the only ones the loss may count."""
        if self.loss_mask is None:
            return np.ones(len(self) - self.prompt_len, dtype=bool)
        return self.loss_mask


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
            # a writable copy of the wire buffer
            behaviour_logprobs=np.array(c.logprobs, dtype=np.float32),
            versions=np.array(c.versions, dtype=np.int64),
            advantage=float(adv),
            reward=float(c.reward),
            group_id=group.group_id,
            ref_logprobs=None
            if c.ref_logprobs is None
            else np.array(c.ref_logprobs, dtype=np.float32),
            loss_mask=None if c.loss_mask is None else np.array(c.loss_mask, dtype=bool),
        )
        for c, adv in zip(group.completions, advantages, strict=True)
    ]


def partition_across_ranks(
    samples: Sequence[T], world_size: int, size: Callable[[T], int] = len
) -> list[list[T]]:
    """Balanced shares: longest sample first (``size``: its tokens), each to the rank with the
    fewest tokens so far (ties: lowest rank)."""
    shares: list[list[T]] = [[] for _ in range(world_size)]
    loads = [0] * world_size
    for sample in sorted(samples, key=size, reverse=True):
        rank = min(range(world_size), key=lambda r: (loads[r], r))
        shares[rank].append(sample)
        loads[rank] += size(sample)
    return shares


# Short samples (the demo's are 6-9 tokens) pack several to a row only in rows wider than the
# longest; attention over a 64-token row costs little next to the linear layers, and samples
# longer than this set the width themselves.
MIN_ROW_WIDTH = 64


class _Rows:
    """Rows of ``width`` tokens filled best-fit: each item goes to the row with the least room
    that holds it (ties: the earliest row), found by bisection in the rows sorted by room."""

    def __init__(self, width: int):
        self.width = width
        self.members: list[list[int]] = []
        # (room left, row) of every row, ascending
        self.rooms: list[tuple[int, int]] = []

    def place(self, item: int, length: int) -> bool:
        """Put ``item`` into the best-fitting row; False when no row has room for it."""
        at = bisect.bisect_left(self.rooms, (length, -1))
        if at == len(self.rooms):
            return False
        room, row = self.rooms.pop(at)
        self.members[row].append(item)
        bisect.insort(self.rooms, (room - length, row))
        return True

    def open(self, item: int, length: int) -> None:
        bisect.insort(self.rooms, (self.width - length, len(self.members)))
        self.members.append([item])

    @property
    def tokens(self) -> int:
        return len(self.members) * self.width


def row_width(longest: int, token_budget: int | None = None) -> int:
    """Packed rows are as wide as the longest sample, and at least ``MIN_ROW_WIDTH`` (or the
    micro-batches' token budget, when smaller)."""
    floor = MIN_ROW_WIDTH if token_budget is None else min(MIN_ROW_WIDTH, token_budget)
    return max(longest, floor)


def pack_rows(lengths: list[int], token_budget: int | None = None) -> list[list[int]]:
    """Best-fit decreasing: indices into ``lengths`` shared out into rows of ``row_width``.

    Rows hold their indices longest first; ties keep the given order.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    rows = _Rows(row_width(max(lengths, default=0), token_budget))
    for i in order:
        if not rows.place(i, lengths[i]):
            rows.open(i, lengths[i])
    return rows.members


def pack_micro_batches(samples: list[Sample], token_budget: int) -> list[list[Sample]]:
    """Runs of length-sorted samples whose packed rows (``pack_rows``: rows x their width) fit the budget.

    A sample longer than the budget gets a micro-batch of its own. Each run is
    what ``pack_rows`` packs the same way again in ``collate``.
    """
    batches: list[list[Sample]] = []
    current: list[Sample] = []
    rows = _Rows(0)
    for sample in sorted(samples, key=len, reverse=True):
        n = len(sample)
        if current and rows.place(len(current), n):
            current.append(sample)
            continue
        if current and rows.tokens + rows.width > token_budget:
            batches.append(current)
            current = []
        if not current:
            rows = _Rows(row_width(n, token_budget))
        rows.open(len(current), n)
        current.append(sample)
    if current:
        batches.append(current)
    return batches


@dataclass
class MicroBatch:
    """The sample layout (one right-padded row per sample: target position t predicts
    ``input_ids[:, t + 1]``) and the packed rows the model runs on."""

    input_ids: Tensor  # [B, L] int64
    attention_mask: Tensor  # [B, L] int64
    # [B, L - 1] bool: target is a completion token the model sampled (not prompt, not padding,
    # not an environment's)
    completion_mask: Tensor
    behaviour_logprobs: Tensor  # [B, L - 1] float32, 0 outside the completion
    versions: Tensor  # [B, L - 1] int64, -1 outside the completion
    advantages: Tensor  # [B] float32
    # [R, W] int64: ``pack_rows``'s rows, pad_id after the last sample of a row
    packed_ids: Tensor
    # [R, W] int64: each sample's own positions; a row's padding continues the row's
    position_ids: Tensor
    # [B, L - 1] int64: where each target position of the sample layout sits in the packed
    # rows' targets flattened ([R * (W - 1)]); 0 at padding
    packed_index: Tensor
    # [B, L - 1] float32, 0 outside the completion; None unless every sample carries them
    ref_logprobs: Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.completion_mask.sum())

    @property
    def sequence_tokens(self) -> int:
        """Prompt + completion tokens of the samples."""
        return int(self.attention_mask.sum())

    @property
    def packed_tokens(self) -> int:
        """Tokens a forward pass runs on: the packed rows x their width, padding included."""
        return self.packed_ids.numel()

    def to(self, device: torch.device) -> MicroBatch:
        """The same micro-batch on ``device`` (the model's: collate builds it on the CPU)."""
        moved = (getattr(self, f.name) for f in fields(self))
        return MicroBatch(*(None if t is None else t.to(device) for t in moved))


def _ragged_positions(
    lengths: np.ndarray, offsets: np.ndarray, rows: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(row, column) of every element when item i holds ``lengths[i]`` values from column
    ``offsets[i]`` of row ``rows[i]`` (default: row i)."""
    rows = np.arange(len(lengths)) if rows is None else rows
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    columns = np.arange(int(lengths.sum())) - starts + np.repeat(offsets, lengths)
    return np.repeat(rows, lengths), columns


def _packing(lengths: np.ndarray, token_budget: int | None) -> tuple[int, np.ndarray, np.ndarray]:
    """(row count, each sample's row, each sample's first column) of ``pack_rows``."""
    row_of = np.zeros(len(lengths), dtype=np.int64)
    column_of = np.zeros(len(lengths), dtype=np.int64)
    packed = pack_rows(lengths.tolist(), token_budget)
    for row, members in enumerate(packed):
        column = 0
        for i in members:
            row_of[i], column_of[i] = row, column
            column += lengths[i]
    return len(packed), row_of, column_of


def collate(samples: list[Sample], pad_id: int, token_budget: int | None = None) -> MicroBatch:
    """The micro-batch of ``samples``, in the sample layout (row i is ``samples[i]``) and packed
    (``token_budget``: the one ``pack_micro_batches`` planned it under).

    One scatter per tensor instead of a copy per row: a 256-sample demo batch collated row by
    row cost ~3 % of a learner step."""
    if not samples:
        raise ValueError("cannot collate an empty micro-batch")
    lengths = np.fromiter((len(s) for s in samples), dtype=np.int64, count=len(samples))
    prompts = np.fromiter((s.prompt_len for s in samples), dtype=np.int64, count=len(samples))
    rows, width = len(samples), int(lengths.max())
    at = _ragged_positions(lengths, np.zeros_like(lengths))
    input_ids = np.full((rows, width), pad_id, dtype=np.int64)
    input_ids[at] = np.concatenate([s.input_ids for s in samples])
    attention_mask = np.zeros((rows, width), dtype=np.int64)
    attention_mask[at] = 1
    # completion token k sits at input position p + k, so its target position is p + k - 1
    target = _ragged_positions(lengths - prompts, prompts - 1)
    completion_mask = np.zeros((rows, width - 1), dtype=bool)
    completion_mask[target] = np.concatenate([s.trained() for s in samples])
    behaviour = np.zeros((rows, width - 1), dtype=np.float32)
    behaviour[target] = np.concatenate([s.behaviour_logprobs for s in samples])
    versions = np.full((rows, width - 1), -1, dtype=np.int64)
    versions[target] = np.concatenate([s.versions for s in samples])
    advantages = torch.tensor([s.advantage for s in samples], dtype=torch.float32)
    packed_rows, row_of, column_of = _packing(lengths, token_budget)
    packed_at = _ragged_positions(lengths, column_of, row_of)
    packed_width = row_width(width, token_budget)
    packed_ids = np.full((packed_rows, packed_width), pad_id, dtype=np.int64)
    packed_ids[packed_at] = input_ids[at]
    position_ids = np.tile(np.arange(packed_width, dtype=np.int64), (packed_rows, 1))
    position_ids[packed_at] = at[1]
    # sample target position t (predicting token t + 1) is packed target position column + t
    sample_targets = _ragged_positions(lengths - 1, np.zeros_like(lengths))
    packed_targets = _ragged_positions(lengths - 1, column_of, row_of)
    packed_index = np.zeros((rows, width - 1), dtype=np.int64)
    packed_index[sample_targets] = packed_targets[0] * (packed_width - 1) + packed_targets[1]
    ref = None
    if all(s.ref_logprobs is not None for s in samples):
        ref = np.zeros((rows, width - 1), dtype=np.float32)
        ref[target] = np.concatenate([s.ref_logprobs for s in samples])
        ref = torch.from_numpy(ref)
    return MicroBatch(
        torch.from_numpy(input_ids),
        torch.from_numpy(attention_mask),
        torch.from_numpy(completion_mask),
        torch.from_numpy(behaviour),
        torch.from_numpy(versions),
        advantages,
        torch.from_numpy(packed_ids),
        torch.from_numpy(position_ids),
        torch.from_numpy(packed_index),
        ref,
    )


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


def rank_micro_batches(
    samples: list[Sample], world: int, rank: int, budget: int, pad_id: int, device
) -> tuple[list[MicroBatch], int]:
    """This rank's collated micro-batches of ``samples`` (``plan_rank_micro_batches``), fillers
    included, and how many of them are real."""
    mine, count = plan_rank_micro_batches(samples, world, rank, budget)
    batches = [collate(b, pad_id, budget).to(device) for b in mine]
    return with_fillers(batches, count, samples[:1], pad_id, budget, device)


def with_fillers(
    batches: list[MicroBatch], count: int, spare: list[Sample], pad_id: int, budget: int, device
) -> tuple[list[MicroBatch], int]:
    """``batches`` padded to ``count`` with ``masked_out`` copies (of ``spare`` collated, where
    this rank has none), and how many of them are real."""
    real = len(batches)
    filler = masked_out(batches[0] if batches else collate(spare, pad_id, budget).to(device))
    return batches + [filler] * (count - real), real


def masked_out(batch: MicroBatch) -> MicroBatch:
    """The same tensors with nothing counted (no completion token, no sequence token): a filler
    micro-batch that contributes zero gradient."""
    return replace(
        batch,
        completion_mask=torch.zeros_like(batch.completion_mask),
        attention_mask=torch.zeros_like(batch.attention_mask),
    )
