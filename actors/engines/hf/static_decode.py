"""The hf engine's static decode batch: KV rows allocated once, so a decode step can be a CUDA graph.

Each batch row owns a fixed slot: per layer, keys and values ``[slots, heads, length, head_dim]``
allocated once (and reallocated, rarely, when a longer prompt needs more columns). A row's token
at position p has its key and value at column p, so rows of different lengths share one step
without padding: a step writes each row's new key at the row's own position (``SlotLayer``) and
its attention mask, computed on the device from the positions, lets a row see columns 0..p. No
step reads anything from the host or changes a shape, so one graph per batch size replays it
(``decode_runners``).

A step runs the live rows ``0..rows-1`` padded to the next bucket (powers of two up to the slot
count, and the slot count): the padding rows are free slots at position 0, whose writes land in
rows nobody reads (a prefill overwrites a slot's columns before its row attends to them). Rows
that finish and are not refilled are compacted down (their KV rows copied), as the dynamic batch
drops them.

Prefill stays eager (``prefill.prefill``) and is copied into the slots' first columns; a kept
session cache (``kv_sessions``) is a copy of a slot's first columns, so multi-turn continuation
works as on the dynamic batch.
"""

from __future__ import annotations

import numpy as np
import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from streamrl.actors.engines.hf.decode_runners import EagerRunner, GraphRunner
from streamrl.actors.engines.hf.kv_sessions import Saved
from streamrl.actors.engines.hf.prefill import KeysValues, prefill

# columns are allocated in multiples of this: a refill's slightly longer prompt rarely regrows
COLUMN_GRANULE = 64


def buckets(slots: int) -> tuple[int, ...]:
    """Batch sizes a decode step runs at (one graph each): the powers of two below ``slots``, and ``slots``."""
    sizes = []
    size = 1
    while size < slots:
        sizes.append(size)
        size *= 2
    return (*sizes, slots)


def bucket_for(rows: int, sizes: tuple[int, ...]) -> int:
    """The smallest bucket that holds ``rows`` live rows."""
    return next(size for size in sizes if size >= rows)


def column_count(needed: int, max_positions: int) -> int:
    """Columns for ``needed`` positions: rounded up to ``COLUMN_GRANULE``, never past the model's."""
    return min(max_positions, -(-needed // COLUMN_GRANULE) * COLUMN_GRANULE)


def step_mask(columns: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """[B, 1, 1, L] boolean: row b attends to columns 0..positions[b] (its keys, the new one last)."""
    return (columns[None, :] <= positions[:, None])[:, None, None, :]


class SlotLayer(CacheLayerMixin):
    """One layer's static keys and values; an update writes row b's new key at ``positions[b]``."""

    is_compileable = True
    is_sliding = False

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor) -> None:
        super().__init__()
        self.keys, self.values, self.positions = keys, values, positions
        self.is_initialized = True

    def lazy_initialization(self, key_states, value_states) -> None:
        """Allocated up front by ``StaticBatch``."""

    def update(self, key_states, value_states, *args, **kwargs):
        """Write the step's keys and values [B, heads, 1, dim] at each row's position; return all
        columns of rows 0..B-1 (views of the static tensors: the mask hides the unused ones)."""
        rows = key_states.shape[0]
        where = self.positions[:rows].view(rows, 1, 1, 1)
        keys, values = self.keys[:rows], self.values[:rows]
        keys.scatter_(2, where.expand(key_states.shape), key_states)
        values.scatter_(2, where.expand(value_states.shape), value_states)
        return keys, values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.keys.shape[2], 0

    def get_seq_length(self) -> int:
        # rows differ; the engine passes position ids and masks, so nothing derives them from this
        return self.keys.shape[2]

    def get_max_length(self) -> int:
        return self.keys.shape[2]


class SlotCache(Cache):
    def __init__(self, layers: list[SlotLayer]) -> None:
        super().__init__(layers=layers)


class StaticBatch:
    """The static decode batch's slots; the same methods as the dynamic ``hf._Batch``.

    Kept by the engine across ``generate`` calls (its graphs with it); ``begin`` empties it.
    Tensors are allocated at the first prefill, inside the engine's inference mode."""

    def __init__(
        self,
        model,
        cache_kw: str,
        device: torch.device,
        layer_types: set[str],
        slots: int,
        max_positions: int,
        graphs: bool,
    ) -> None:
        self.model = model
        self.cache_kw = cache_kw
        self.device = device
        self.layer_types = layer_types
        self.slots = slots
        self.max_positions = max_positions
        self.sizes = buckets(slots)
        self.runner = GraphRunner(self._step, device) if graphs else EagerRunner(self._step)
        self.rows = 0
        # columns past a prompt kept free for its completion (the run's max_new_tokens)
        self.reserve = 0
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.cache: SlotCache | None = None
        # [slots] the token each row feeds next, and its position (= the column it writes)
        self.tokens: torch.Tensor | None = None
        self.positions: torch.Tensor | None = None
        # [L] 0..L-1, what the step's mask compares the positions with
        self.columns: torch.Tensor | None = None
        # the positions on the host, for the checks that must not read the device
        self.host_positions = np.zeros(slots, dtype=np.int64)

    @property
    def holds_addresses(self) -> bool:
        """Whether the decode step holds the parameters by address (a graph): weights must be
        copied into them."""
        return self.runner.holds_addresses

    def begin(self, reserve: int) -> StaticBatch:
        """Empty the batch for a ``generate`` call whose completions take up to ``reserve`` tokens."""
        self.rows = 0
        self.reserve = reserve
        self.host_positions[:] = 0
        if self.positions is not None:
            with torch.inference_mode():
                self.positions.zero_()
        return self

    def prefill(
        self, prompts: list[list[int]], targets: list[int], cached: list[Saved | None]
    ) -> torch.Tensor:
        """Prefill ``prompts`` into slots ``targets``; returns their next-token logits [n, V]."""
        done = prefill(self.model, self.cache_kw, self.device, prompts, cached)
        lengths = [len(p) for p in prompts]
        self._fit(done.kvs[0], max(lengths) + self.reserve)
        by_length: dict[int, list[int]] = {}
        for i, length in enumerate(lengths):
            by_length.setdefault(length, []).append(i)
        for length, members in by_length.items():
            rows = torch.tensor([targets[i] for i in members], device=self.device)
            for side, held in ((0, self.keys), (1, self.values)):
                for number, layer in enumerate(held):
                    block = torch.stack([done.kvs[i][side][number] for i in members])
                    layer[:, :, :length].index_copy_(0, rows, block)
            self.positions.index_fill_(0, rows, length)
            self.host_positions[[targets[i] for i in members]] = length
        self.rows = max(self.rows, max(targets) + 1)
        return done.logits

    def row_cache(self, row: int, length: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Copies of the keys and values of slot ``row``'s first ``length`` columns, per layer."""
        held = int(self.host_positions[row])
        if held != length:
            raise RuntimeError(f"row {row} holds {held} positions, not {length}")
        return (
            [layer[row, :, :length].clone() for layer in self.keys],
            [layer[row, :, :length].clone() for layer in self.values],
        )

    def keep_rows(self, keep: list[int]) -> None:
        """Keep rows ``keep`` (ascending) as rows 0..len(keep)-1: the moved ones' slots are copied."""
        dst = [i for i, k in enumerate(keep) if i != k]
        if dst:
            src = [keep[i] for i in dst]
            to, source = (torch.tensor(x, device=self.device) for x in (dst, src))
            for tensor in (*self.keys, *self.values, self.tokens, self.positions):
                tensor.index_copy_(0, to, tensor.index_select(0, source))
            self.host_positions[dst] = self.host_positions[src]
        # freed slots become padding rows: position 0 keeps their writes inside the columns
        self.positions[len(keep) : self.rows].zero_()
        self.host_positions[len(keep) : self.rows] = 0
        self.rows = len(keep)

    def set_next_tokens(self, targets: list[int], tokens: torch.Tensor) -> None:
        if targets == list(range(self.rows)):
            self.tokens[: self.rows].copy_(tokens)
        else:
            self.tokens.index_copy_(0, torch.tensor(targets, device=self.device), tokens)

    def decode(self) -> torch.Tensor:
        """One step of rows 0..rows-1; returns their next-token logits [rows, V] (a view of the
        runner's output, valid until the next step)."""
        logits = self.runner(bucket_for(self.rows, self.sizes))[: self.rows]
        self.positions[: self.rows] += 1
        self.host_positions[: self.rows] += 1
        return logits

    def _step(self, bucket: int) -> torch.Tensor:
        """The decode step on the static tensors alone: what a graph captures."""
        positions = self.positions[:bucket]
        mask = step_mask(self.columns, positions)
        out = self.model(
            input_ids=self.tokens[:bucket, None],
            position_ids=positions[:, None],
            attention_mask={kind: mask for kind in self.layer_types},
            **{self.cache_kw: self.cache},
            use_cache=True,
        )
        return out.logits[:, -1]

    def _fit(self, example: KeysValues, needed: int) -> None:
        """Allocate the slots (shapes and dtype from one prompt's keys and values), or reallocate
        them with more columns, keeping what they hold; a graph holds the old ones, so it goes."""
        length = column_count(needed, self.max_positions)
        if self.cache is not None and length <= self.columns.shape[0]:
            return
        old = self.columns.shape[0] if self.cache is not None else 0

        def grown(tensors: list[torch.Tensor], like: list[torch.Tensor]) -> list[torch.Tensor]:
            out = []
            for number, sample in enumerate(like):
                heads, _, dim = sample.shape
                fresh = sample.new_zeros(self.slots, heads, length, dim)
                if tensors:
                    fresh[:, :, :old] = tensors[number]
                out.append(fresh)
            return out

        self.keys = grown(self.keys, example[0])
        self.values = grown(self.values, example[1])
        if self.tokens is None:
            self.tokens = torch.zeros(self.slots, dtype=torch.long, device=self.device)
            self.positions = torch.zeros(self.slots, dtype=torch.long, device=self.device)
        self.columns = torch.arange(length, device=self.device)
        self.cache = SlotCache(
            [SlotLayer(k, v, self.positions) for k, v in zip(self.keys, self.values, strict=True)]
        )
        self.runner.reset()
