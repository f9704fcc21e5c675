"""The transformers engine: a hand-written batched decode loop over a shared KV cache.

Rows of the decode batch hold sequences of different lengths, right-aligned in
one ``DynamicCache`` (left padding) with a key-validity mask and per-row
position ids. A finished row is refilled with the next waiting request (its
prompt is prefilled on its own and spliced into the row), so up to
``batch_slots`` sequences decode together while requests keep arriving. Rows
with nothing left to do are dropped from the batch.

On a GPU (``actor.hf.cuda_graphs``) the batch is ``static_decode.StaticBatch`` instead: fixed KV
rows per slot, each decode step replayed as a CUDA graph captured per batch-size bucket; the
same rows, refill, sessions and per-token versions, and weights copied into the parameters in
place (a graph holds them by address). Prefill is eager either way (``prefill``).

A caller can keep the batch full across groups: ``refill(room)`` is asked for up to ``room``
more requests whenever a slot is free and none waits, and ``on_finished`` hears of each
request as it ends, so a long completion never holds finished slots idle while the
caller publishes what is done (the long-tail task: ``actor.refill``).

Identical prompts (the G completions of a group) are prefilled once. Prefill
batches only prompts of one length, so prefill never needs padding or a mask.

Multi-turn trajectories (``Request.session``) continue from their KV cache: when
a row of a session ends, its keys and values are kept (``kv_sessions``), and the
session's next request prefills only the tokens it adds (the last sampled token
and the environment's) on top of them. A weight swap drops every kept cache, and
a row whose turn straddled a swap is not kept: a turn after a swap re-prefills
its whole sequence under the new weights (docs/multiturn.md).

Between two forward passes the engine takes staged weights from its weight
source and copies them into the model in place: every token records the
version of the weights whose logits it was sampled from. With LoRA adapters
travelling alone (``model.lora.sync: adapter``) the model is the peft-wrapped
policy and the staged tensors are its adapters (``weight_targets``): each
version replaces the previous adapters, the base weights stay as loaded.
"""

from __future__ import annotations

import inspect
import logging
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
from transformers import DynamicCache

from streamrl.actors import metrics
from streamrl.actors.engines.base import (
    Engine,
    Output,
    RefillPacer,
    Request,
    SamplingParams,
    WeightSource,
)
from streamrl.actors.engines.hf.kv_sessions import Saved, Sessions
from streamrl.actors.engines.hf.prefill import prefill
from streamrl.actors.engines.hf.sampling import sample
from streamrl.actors.engines.hf.static_support import static_cache_unsupported
from streamrl.weightsync.subscriber import swap_into_model

if TYPE_CHECKING:
    # imported where a static batch is made: it needs hooks an older transformers lacks
    from streamrl.actors.engines.hf.static_decode import StaticBatch

log = logging.getLogger(__name__)


class _Row:
    __slots__ = ("index", "tokens", "logprobs", "versions", "limit", "finish", "swaps")

    def __init__(self, index: int, limit: int, swaps: int = 0) -> None:
        # position in the caller's request list
        self.index = index
        self.tokens: list[int] = []
        self.logprobs: list[float] = []
        self.versions: list[int] = []
        self.limit = limit
        self.finish: str | None = None
        # the engine's swap count at the row's prefill: its KV cache is of one version while equal
        self.swaps = swaps


class HFEngine(Engine):
    def __init__(
        self,
        model,
        tokenizer,
        batch_slots: int = 64,
        weight_source: WeightSource | None = None,
        version: int = 0,
        seed: int = 0,
        weight_targets: dict[str, torch.Tensor] | None = None,
        decode: str = "dynamic",
    ) -> None:
        self.model = model.eval()
        # staged name -> parameter, when the staged names are not the model's (LoRA adapters)
        self.weight_targets = weight_targets
        self.cache_kw = cache_kwarg(model)
        # read only for stop strings: None serves requests of token ids alone
        self.tokenizer = tokenizer
        self.batch_slots = batch_slots
        self.weight_source = weight_source
        # a weight source this engine started and closes (``from_config``'s subscriber)
        self.owned = None
        self.version = version
        self.device = next(model.parameters()).device
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.sessions = Sessions()
        # weight swaps so far: a kept KV cache is valid only under the weights it was computed with
        self.swaps = 0
        config = model.config
        self.max_positions = getattr(config, "max_position_embeddings", None) or 1 << 30
        self.layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
        window = getattr(config, "sliding_window", None)
        if "sliding_attention" in self.layer_types and window and window < self.max_positions:
            raise ValueError(
                f"hf engine: sliding-window attention (window {window}) is not supported by the decode loop; use the vllm engine"
            )
        if decode not in DECODE_MODES:
            raise ValueError(f"hf engine: decode={decode!r}; one of {', '.join(DECODE_MODES)}")
        if decode == "graphs" and self.device.type != "cuda":
            raise ValueError(f"hf engine: CUDA graphs need a CUDA device, not {self.device}")
        if decode != "dynamic" and (reason := static_cache_unsupported()):
            log.warning(
                "static decode batch unavailable, decoding on the dynamic batch: %s", reason
            )
            decode = "dynamic"
        # the static decode batch, kept across calls with its graphs (None: the dynamic batch)
        self.static = None
        if decode != "dynamic":
            from streamrl.actors.engines.hf.static_decode import StaticBatch

            self.static = StaticBatch(
                model,
                self.cache_kw,
                self.device,
                self.layer_types,
                batch_slots,
                self.max_positions,
                graphs=decode == "graphs",
            )

    def maybe_swap_weights(self) -> None:
        """Apply the newest staged weights, if any: between batches and between decode steps."""
        if self.weight_source is None:
            return
        staged = self.weight_source.take_staged()
        if staged is None:
            return
        version, tensors = staged
        # copied in place on the static batch: a captured graph holds the parameters by address,
        # and the eager static batch swaps the same way so that CPU tests cover it
        seconds, replaced = swap_into_model(
            self.model, tensors, self.weight_targets, in_place=self.static is not None
        )
        metrics.WEIGHT_SWAP_SECONDS.observe(seconds)
        self.swaps += 1
        self.sessions.clear()
        self._serve(version)
        self.weight_source.applied(version, recycled=replaced)
        self.weights_from = self.weight_source.live_source

    def end_sessions(self, sessions: Iterable[str]) -> None:
        self.sessions.drop(sessions)

    def close(self) -> None:
        if self.owned is not None:
            self.owned.close()

    # -- generation ----------------------------------------------------------------------------

    def generate(
        self,
        requests: Sequence[Request],
        params: SamplingParams,
        should_abort: Callable[[], bool] | None = None,
        refill: Callable[[int], Sequence[Request]] | None = None,
        on_finished: Callable[[int, Output], None] | None = None,
    ) -> list[Output]:
        """As ``Engine.generate``: rows decode together; a freed slot takes the next waiting request,
        or one ``refill`` gives when none waits."""
        run = _Run(self, requests, params, on_finished)
        with torch.inference_mode():
            while True:
                if should_abort is not None and should_abort():
                    run.abort()
                    break
                self.maybe_swap_weights()
                free = run.retire_finished()
                capacity = len(free) + max(0, self.batch_slots - len(run.rows))
                if refill is not None and capacity > len(run.pending):
                    run.ask(refill, capacity - len(run.pending), last_chance=run.idle)
                if not (run.pending or run.rows):
                    break
                run.admit(free, capacity)
                run.drop_finished()
                if run.rows:
                    run.decode()
        metrics.TOKENS_GENERATED.inc(sum(len(row.tokens) for row in run.done.values()))
        return [self._output(run.requests[i], run.done[i]) for i in range(len(run.requests))]

    def _batch(self, params: SamplingParams) -> _Batch | StaticBatch:
        """A fresh dynamic batch, or the engine's static one emptied."""
        if self.static is None:
            return _Batch(self)
        return self.static.begin(reserve=params.max_new_tokens)

    def _keep_cache(
        self, request: Request, row: _Row, state: _Batch | StaticBatch, slot: int
    ) -> None:
        """Keep a finished row's KV cache for its session's next turn, if it is of one version."""
        if request.session is None or row.swaps != self.swaps:
            return
        tokens = tuple(request.prompt_token_ids) + tuple(row.tokens[:-1])
        keys, values = state.row_cache(slot, len(tokens))
        self.sessions.save(request.session, Saved(tokens, keys, values))

    def _token_limit(self, request: Request, params: SamplingParams) -> int:
        if not request.prompt_token_ids:
            raise ValueError(f"request {request.request_id}: empty prompt")
        room = self.max_positions - len(request.prompt_token_ids)
        if room < 1:
            raise ValueError(
                f"request {request.request_id}: prompt of {len(request.prompt_token_ids)} tokens leaves no room "
                f"in the model's {self.max_positions} positions"
            )
        return min(params.max_new_tokens, room)

    @staticmethod
    def _output(request: Request, row: _Row) -> Output:
        return Output(
            request_id=request.request_id,
            token_ids=np.asarray(row.tokens, dtype=np.int32),
            logprobs=np.asarray(row.logprobs, dtype=np.float32),
            versions=np.asarray(row.versions, dtype=np.int32),
            finish_reason=row.finish or "abort",
        )


class _Run:
    """One ``generate`` call's rows, waiting requests and finished ones."""

    def __init__(self, engine: HFEngine, requests, params: SamplingParams, on_finished) -> None:
        self.engine = engine
        self.params = params
        self.on_finished = on_finished
        self.requests = list(requests)
        self.limits = [engine._token_limit(r, params) for r in self.requests]
        self.stop_ids = torch.tensor(
            sorted(set(params.stop_token_ids)) or [-1], device=engine.device
        )
        if params.stop and engine.tokenizer is None:
            raise ValueError("hf engine: stop strings need the engine's tokenizer; it has none")
        longest_stop = max(
            (len(engine.tokenizer.encode(s, add_special_tokens=False)) for s in params.stop),
            default=0,
        )
        self.stop_window = longest_stop + 2
        self.pending = deque(range(len(self.requests)))
        self.rows: list[_Row] = []
        self.done: dict[int, _Row] = {}
        self.state = engine._batch(params)
        self.pacer = RefillPacer()

    def finish(self, row: _Row, slot: int) -> None:
        self.engine._keep_cache(self.requests[row.index], row, self.state, slot)
        self.done[row.index] = row
        if self.on_finished is not None:
            self.on_finished(row.index, self.engine._output(self.requests[row.index], row))

    def abort(self) -> None:
        # rows that just finished keep their reason
        for row in self.rows:
            row.finish = row.finish or "abort"
            self.done[row.index] = row
        for index in self.pending:
            self.done[index] = _Row(index, 0)
            self.done[index].finish = "abort"

    def retire_finished(self) -> list[int]:
        """Report the rows that finished; their slots are free for new requests."""
        free = [i for i, row in enumerate(self.rows) if row.finish is not None]
        for i in free:
            self.finish(self.rows[i], i)
        return free

    @property
    def idle(self) -> bool:
        """Nothing waits and every row has finished: the call ends unless ``refill`` gives more."""
        return not self.pending and all(row.finish is not None for row in self.rows)

    def ask(self, refill: Callable[[int], Sequence[Request]], room: int, last_chance: bool) -> None:
        """Up to ``room`` more requests from ``refill``, when ``RefillPacer`` says it is due
        (``last_chance``: nothing would decode without them)."""
        if not self.pacer.due(last_chance):
            return
        more = list(refill(room))
        self.pacer.gave(more)
        for request in more:
            self.limits.append(self.engine._token_limit(request, self.params))
            self.requests.append(request)
            self.pending.append(len(self.requests) - 1)

    def admit(self, free: list[int], capacity: int) -> None:
        """Prefill waiting requests into the free slots, then new ones up to ``capacity``."""
        admitted = [self.pending.popleft() for _ in range(min(capacity, len(self.pending)))]
        if not admitted:
            return
        reused = free[: len(admitted)]
        targets = reused + list(range(len(self.rows), len(self.rows) + len(admitted) - len(reused)))
        new_rows = [_Row(index, self.limits[index], self.engine.swaps) for index in admitted]
        for target, row in zip(targets, new_rows, strict=True):
            if target < len(self.rows):
                self.rows[target] = row
            else:
                self.rows.append(row)
        prompts = [self.requests[i].prompt_token_ids for i in admitted]
        cached = [
            self.engine.sessions.take(self.requests[i].session, prompt)
            for i, prompt in zip(admitted, prompts, strict=True)
        ]
        logits = self.state.prefill(prompts, targets, cached)
        self.record(new_rows, logits, targets)

    def drop_finished(self) -> None:
        """Drop the rows that finished and no new request took (reported here)."""
        keep = [i for i, row in enumerate(self.rows) if row.finish is None]
        if len(keep) == len(self.rows):
            return
        for i, row in enumerate(self.rows):
            if row.finish is not None and row.index not in self.done:
                self.finish(row, i)
        self.rows = [self.rows[i] for i in keep]
        self.state.keep_rows(keep)

    def decode(self) -> None:
        self.record(self.rows, self.state.decode(), list(range(len(self.rows))))

    def record(self, rows: list[_Row], logits: torch.Tensor, targets: list[int]) -> None:
        """Sample one token for each of ``rows`` from ``logits`` and check their stop conditions."""
        params = self.params
        tokens, logprobs = sample(
            logits, params.temperature, params.top_k, params.top_p, self.engine.generator
        )
        self.state.set_next_tokens(targets, tokens)
        stopped = torch.isin(tokens, self.stop_ids).tolist()
        version = self.engine.version
        for row, token, logprob, is_stop in zip(
            rows, tokens.tolist(), logprobs.tolist(), stopped, strict=True
        ):
            row.tokens.append(token)
            row.logprobs.append(logprob)
            row.versions.append(version)
            if is_stop:
                row.finish = "stop"
            elif params.stop and self._hits_stop_string(row.tokens):
                row.finish = "stop"
            elif len(row.tokens) >= row.limit:
                row.finish = "length"

    def _hits_stop_string(self, tokens: list[int]) -> bool:
        tail = self.engine.tokenizer.decode(tokens[-self.stop_window :], skip_special_tokens=False)
        return any(s in tail for s in self.params.stop)


# how the engine decodes: "dynamic" = a left-padded DynamicCache (``_Batch``); "static" = fixed
# KV rows per slot, steps run eagerly; "graphs" = the same, steps replayed as CUDA graphs
DECODE_MODES = ("dynamic", "static", "graphs")


def cache_kwarg(model) -> str:
    """The name under which ``model.forward`` takes a KV cache: transformers 5.24 renamed
    ``past_key_values`` to ``cache`` (the old name warns that it goes away); the vLLM CPU venv
    pins transformers < 5.20, which knows only the old name."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class _Batch:
    """The decode batch's KV cache, key-validity mask, positions and next input tokens."""

    def __init__(self, engine: HFEngine) -> None:
        self.model = engine.model
        self.cache_kw = engine.cache_kw
        self.device = engine.device
        self.layer_types = engine.layer_types
        self.cache: DynamicCache | None = None
        # [B, L] real key positions
        self.valid = torch.zeros(0, 0, dtype=torch.bool, device=self.device)
        # [B] position id of the next input
        self.positions = torch.zeros(0, dtype=torch.long, device=self.device)
        # [B] the token each row feeds next
        self.next_tokens = torch.zeros(0, dtype=torch.long, device=self.device)

    @property
    def rows(self) -> int:
        return self.valid.shape[0]

    def prefill(
        self, prompts: list[list[int]], targets: list[int], cached: list[Saved | None]
    ) -> torch.Tensor:
        """Prefill ``prompts`` into batch rows ``targets``; returns their next-token logits [n, V]
        (``prefill.prefill``: a prompt with a ``cached`` entry runs only its tokens past it)."""
        done = prefill(self.model, self.cache_kw, self.device, prompts, cached)
        if self.cache is None:
            self._adopt_empty(done.cache)
        self._place(done.kvs, [len(p) for p in prompts], targets)
        return done.logits

    def row_cache(self, row: int, length: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Copies of the keys and values of row ``row``'s last ``length`` positions, per layer."""
        # a row's positions are its last valid columns (left padding)
        held = int(self.valid[row].sum())
        if held != length:
            raise RuntimeError(f"row {row} holds {held} positions, not {length}")
        width = self.valid.shape[1]
        return (
            [layer.keys[row, :, width - length :].clone() for layer in self.cache.layers],
            [layer.values[row, :, width - length :].clone() for layer in self.cache.layers],
        )

    def _adopt_empty(self, cache: DynamicCache) -> None:
        """Take an initialised cache's layers (their types and dtypes) with zero rows and columns."""
        for layer in cache.layers:
            layer.keys = layer.keys[:0, :, :0]
            layer.values = layer.values[:0, :, :0]
        self.cache = cache

    def _place(self, kvs, lengths: list[int], targets: list[int]) -> None:
        needed = max(targets) + 1
        longest = max(lengths)
        grow_rows = max(0, needed - self.rows)
        grow_cols = max(0, longest - self.valid.shape[1])
        if grow_rows or grow_cols:
            for layer in self.cache.layers:
                layer.keys = _pad(layer.keys, grow_rows, grow_cols)
                layer.values = _pad(layer.values, grow_rows, grow_cols)
            self.valid = _pad(self.valid, grow_rows, grow_cols)
            self.positions = torch.cat([self.positions, self.positions.new_zeros(grow_rows)])
            self.next_tokens = torch.cat([self.next_tokens, self.next_tokens.new_zeros(grow_rows)])
        width = self.valid.shape[1]
        # rows of one prompt length are written together: a few tensor ops per layer for the
        # whole group, not four per row and layer (a GPU launches each one as a kernel)
        by_length: dict[int, list[int]] = {}
        for i, length in enumerate(lengths):
            by_length.setdefault(length, []).append(i)
        for length, members in by_length.items():
            rows = torch.tensor([targets[i] for i in members], device=self.device)
            for number, layer in enumerate(self.cache.layers):
                for side, cached in ((0, layer.keys), (1, layer.values)):
                    block = cached.new_zeros(len(members), *cached.shape[1:])
                    block[:, :, width - length :] = torch.stack(
                        [kvs[i][side][number] for i in members]
                    )
                    cached.index_copy_(0, rows, block)
            valid = self.valid.new_zeros(len(members), width)
            valid[:, width - length :] = True
            self.valid.index_copy_(0, rows, valid)
            self.positions.index_fill_(0, rows, length)
        self._trim()

    def keep_rows(self, keep: list[int]) -> None:
        index = torch.tensor(keep, dtype=torch.long, device=self.device)
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(0, index)
            layer.values = layer.values.index_select(0, index)
        self.valid = self.valid.index_select(0, index)
        self.positions = self.positions.index_select(0, index)
        self.next_tokens = self.next_tokens.index_select(0, index)
        self._trim()

    def _trim(self) -> None:
        """Drop leading key columns that no row attends to any more."""
        if self.rows == 0 or self.valid.shape[1] == 0:
            return
        first = int(self.valid.any(0).to(torch.int8).argmax())
        if first > 0:
            for layer in self.cache.layers:
                layer.keys = layer.keys[:, :, first:]
                layer.values = layer.values[:, :, first:]
            self.valid = self.valid[:, first:]

    def set_next_tokens(self, targets: list[int], tokens: torch.Tensor) -> None:
        if len(targets) == self.rows:
            self.next_tokens = tokens.clone()
        else:
            self.next_tokens[targets] = tokens

    def decode(self) -> torch.Tensor:
        """One forward step of every row; returns next-token logits [B, V]."""
        self.valid = torch.cat([self.valid, self.valid.new_ones(self.rows, 1)], dim=1)
        mask = None
        if not bool(self.valid.all()):
            row_mask = self.valid[:, None, None, :]
            mask = {kind: row_mask for kind in self.layer_types}
        out = self.model(
            input_ids=self.next_tokens[:, None],
            position_ids=self.positions[:, None],
            attention_mask=mask,
            **{self.cache_kw: self.cache},
            use_cache=True,
        )
        self.positions = self.positions + 1
        return out.logits[:, -1]


def _pad(tensor: torch.Tensor, rows: int, left_cols: int) -> torch.Tensor:
    """Append ``rows`` zero rows (dim 0) and prepend ``left_cols`` zero columns on the sequence dim."""
    if rows > 0:
        tensor = torch.cat([tensor, tensor.new_zeros(rows, *tensor.shape[1:])], dim=0)
    if left_cols > 0:
        seq_dim = 2 if tensor.dim() == 4 else 1
        shape = list(tensor.shape)
        shape[seq_dim] = left_cols
        tensor = torch.cat([tensor.new_zeros(shape), tensor], dim=seq_dim)
    return tensor
