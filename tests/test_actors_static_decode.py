"""The hf engine's static decode batch (``actor.hf.cuda_graphs``), run by its eager runner on CPU: the
same tokens, log-probs, versions and finish reasons as the dynamic batch, through slot refill,
stops, length limits, a weight swap mid-decode (copied in place) and multi-turn sessions; the
step's pieces against slow references. Graph capture and replay: tests/test_actors_cuda.py."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from streamrl.actors.engines.base import Request, SamplingParams
from streamrl.actors.engines.hf import static_decode
from streamrl.actors.engines.hf.engine import HFEngine, _Batch
from streamrl.actors.engines.hf.static_decode import (
    SlotLayer,
    bucket_for,
    buckets,
    column_count,
    step_mask,
)
from streamrl.policy.load import load_policy, load_tokenizer
from streamrl.weightsync.subscriber import swap_into_model

PROMPTS = ["314>", "12>", "98765>", "1>", "4444>", "abcdefgh>", "70>"]


@pytest.fixture(scope="module")
def policy64(demo_policy):
    """The demo policy in float64: the two batches' arithmetic differs only in summation order."""
    return load_policy(demo_policy, torch.float64), load_tokenizer(demo_policy)


def _requests(tokenizer, n: int) -> list[Request]:
    return [Request(str(i), tokenizer(PROMPTS[i % len(PROMPTS)])["input_ids"]) for i in range(n)]


def _assert_same(dynamic, static) -> None:
    for a, b in zip(dynamic, static, strict=True):
        assert a.request_id == b.request_id and a.finish_reason == b.finish_reason
        assert a.token_ids.tolist() == b.token_ids.tolist()
        assert a.versions.tolist() == b.versions.tolist()
        # float64 log-probs stored as float32: equal but for the rounding of a ~1e-15 difference
        np.testing.assert_allclose(a.logprobs, b.logprobs, rtol=1e-6, atol=0)


def test_buckets_are_powers_of_two_up_to_the_slots_and_hold_the_rows():
    assert buckets(1) == (1,)
    assert buckets(8) == (1, 2, 4, 8)
    assert buckets(6) == (1, 2, 4, 6)
    for slots in (1, 5, 6, 8):
        sizes = buckets(slots)
        for rows in range(1, slots + 1):
            bucket = bucket_for(rows, sizes)
            assert rows <= bucket and bucket in sizes
            assert not any(rows <= s < bucket for s in sizes)
    assert column_count(1, 4096) == 64 and column_count(65, 4096) == 128
    assert column_count(100, 80) == 80


def test_the_step_mask_lets_each_row_see_its_columns_up_to_its_position():
    positions = torch.tensor([0, 3, 5])
    mask = step_mask(torch.arange(6), positions)
    assert mask.shape == (3, 1, 1, 6)
    for b, p in enumerate(positions.tolist()):
        assert mask[b, 0, 0].tolist() == [c <= p for c in range(6)]


def test_a_slot_layer_writes_each_row_at_its_own_position_and_nothing_else():
    gen = torch.Generator().manual_seed(0)
    keys, values = torch.randn(4, 2, 7, 3, generator=gen), torch.randn(4, 2, 7, 5, generator=gen)
    positions = torch.tensor([2, 0, 6, 1])
    layer = SlotLayer(keys.clone(), values.clone(), positions)
    new_k, new_v = torch.randn(3, 2, 1, 3, generator=gen), torch.randn(3, 2, 1, 5, generator=gen)
    got_k, got_v = layer.update(new_k, new_v)
    want_k, want_v = keys.clone(), values.clone()
    for b in range(3):
        want_k[b, :, positions[b]] = new_k[b, :, 0]
        want_v[b, :, positions[b]] = new_v[b, :, 0]
    assert torch.equal(layer.keys, want_k) and torch.equal(layer.values, want_v)
    # rows 0..2 come back as views of the static rows
    assert torch.equal(got_k, want_k[:3]) and got_k.data_ptr() == layer.keys.data_ptr()
    assert torch.equal(got_v, want_v[:3])


def test_static_steps_give_the_dynamic_steps_logits_through_refill_and_compaction(
    policy64, monkeypatch
):
    """Float64 logits of the two batches fed the same tokens: prefill 3 rows, decode, drop row 1
    (rows compact), refill a slot with a prompt long enough to regrow the columns, decode on."""
    model, tokenizer = policy64
    engines = [HFEngine(model, tokenizer, batch_slots=4, decode=d) for d in ("dynamic", "static")]
    # columns in 8s (the demo policy has only 64 positions): the first prompts (up to 6 tokens)
    # and 6 more fit 16 columns, the longer prompt (11 tokens) regrows them to 24 mid-decode
    monkeypatch.setattr(static_decode, "COLUMN_GRANULE", 8)
    params = SamplingParams(max_new_tokens=6)
    prompts = [r.prompt_token_ids for r in _requests(tokenizer, 3)]
    longer = tokenizer("abcdefgh>12")["input_ids"]
    with torch.inference_mode():
        batches = [_Batch(engines[0]), engines[1]._batch(params)]
        logits = [b.prefill(prompts, [0, 1, 2], [None] * 3) for b in batches]

        def step():
            torch.testing.assert_close(logits[1], logits[0], rtol=0, atol=1e-10)
            tokens = logits[0].argmax(-1)
            for b in batches:
                b.set_next_tokens(list(range(b.rows)), tokens)
            return [b.decode() for b in batches]

        for _ in range(3):
            logits = step()
        for b in batches:
            b.keep_rows([0, 2])
        logits = [lg[[0, 2]] for lg in logits]
        for _ in range(2):
            logits = step()
        assert batches[1].columns.shape[0] == 16
        refilled = [b.prefill([longer], [2], [None]) for b in batches]
        assert batches[1].columns.shape[0] == 24
        torch.testing.assert_close(refilled[1], refilled[0], rtol=0, atol=1e-10)
        tokens = refilled[0].argmax(-1)
        for b in batches:
            b.set_next_tokens([2], tokens)
        logits = [torch.cat([lg, r]) for lg, r in zip(logits, refilled, strict=True)]
        for _ in range(3):
            logits = step()
        torch.testing.assert_close(logits[1], logits[0], rtol=0, atol=1e-10)


def test_the_static_batch_completes_as_the_dynamic_one_through_refill_stops_and_limits(policy64):
    model, tokenizer = policy64
    sizes = []
    hook = model.register_forward_pre_hook(
        lambda _m, _a, kw: sizes.append(kw["input_ids"].shape), with_kwargs=True
    )
    params = SamplingParams(max_new_tokens=10, stop_token_ids=(tokenizer.eos_token_id,))
    outputs = {}
    try:
        for decode in ("dynamic", "static"):
            waves = [_requests(tokenizer, 9)[5:], []]
            finished = {}
            engine = HFEngine(model, tokenizer, batch_slots=3, seed=2, decode=decode)
            sizes.clear()
            outputs[decode] = engine.generate(
                _requests(tokenizer, 5),
                params,
                refill=lambda room, waves=waves: waves.pop(0) if waves else [],
                on_finished=lambda i, o, finished=finished: finished.setdefault(i, o),
            )
            assert sorted(finished) == list(range(9))
    finally:
        hook.remove()
    _assert_same(outputs["dynamic"], outputs["static"])
    reasons = {o.finish_reason for o in outputs["static"]}
    assert reasons == {"stop", "length"}, "the case must exercise both stop tokens and limits"
    # the static run's decode steps ran at the buckets 1, 2 and 3 (its slots) only, and all of them
    steps = {shape[0] for shape in sizes if shape[1] == 1}
    assert steps <= {1, 2, 3} and 3 in steps and len(steps) > 1


class _SwapAt:
    """Stages version 1 (the weights moved) at the ``at``-th poll, as a subscriber lends it."""

    live_source = ""

    def __init__(self, model, at: int) -> None:
        self.at, self.polls, self.recycled = at, 0, None
        gen = torch.Generator().manual_seed(0)
        self.tensors = {
            n: p.detach() + 0.05 * torch.randn(p.shape, generator=gen, dtype=p.dtype)
            for n, p in model.named_parameters()
        }

    def take_staged(self):
        self.polls += 1
        return (1, self.tensors) if self.polls == self.at else None

    def applied(self, version, recycled=None):
        self.recycled = recycled


def test_a_swap_mid_decode_is_copied_in_place_and_versions_match_the_dynamic_batch(policy64):
    model, tokenizer = policy64
    params = SamplingParams(max_new_tokens=9)
    outputs = {}
    for decode in ("dynamic", "static"):
        own = copy.deepcopy(model)
        storages = {n: p.data_ptr() for n, p in own.named_parameters()}
        source = _SwapAt(own, at=4)
        engine = HFEngine(
            own, tokenizer, batch_slots=4, weight_source=source, seed=3, decode=decode
        )
        outputs[decode] = engine.generate(_requests(tokenizer, 6), params)
        assert engine.version == 1
        for name, p in own.named_parameters():
            assert torch.equal(p.detach(), source.tensors[name])
        if decode == "static":
            # the parameters kept their storages; the staged tensors went back for the next version
            assert {n: p.data_ptr() for n, p in own.named_parameters()} == storages
            assert all(source.recycled[n] is t for n, t in source.tensors.items())
    _assert_same(outputs["dynamic"], outputs["static"])
    # the first 4 requests straddle the swap (poll 4 precedes token 4); the last 2 start after it
    versions = [o.versions.tolist() for o in outputs["static"]]
    assert versions == [[0] * 4 + [1] * 5] * 4 + [[1] * 9] * 2


def test_in_place_swap_keeps_storages_and_hands_back_the_staged_tensors():
    model = torch.nn.Linear(3, 2)
    before = {n: p.data_ptr() for n, p in model.named_parameters()}
    staged = {n: torch.full_like(p, 2.0) for n, p in model.named_parameters()}
    _, replaced = swap_into_model(model, staged, in_place=True)
    assert {n: p.data_ptr() for n, p in model.named_parameters()} == before
    assert all(torch.equal(p, staged[n]) for n, p in model.named_parameters())
    assert all(replaced[n] is staged[n] for n in staged)


def test_a_session_continues_from_its_slot_as_on_the_dynamic_batch(policy64):
    model, tokenizer = policy64
    params = SamplingParams(max_new_tokens=5)
    fed = []
    hook = model.register_forward_pre_hook(
        lambda _m, _a, kw: fed.append(kw["input_ids"].shape[1]), with_kwargs=True
    )
    turns = {}
    try:
        for decode in ("dynamic", "static"):
            engine = HFEngine(model, tokenizer, batch_slots=2, seed=7, decode=decode)
            first = [Request(f"s{i}", ids, session=f"s{i}") for i, ids in enumerate(
                r.prompt_token_ids for r in _requests(tokenizer, 2))]  # fmt: skip
            one = engine.generate(first, params)
            assert len(engine.sessions) == 2
            fed.clear()
            second = [
                Request(r.request_id, r.prompt_token_ids + o.token_ids.tolist() + [5], r.session)
                for r, o in zip(first, one, strict=True)
            ]
            two = engine.generate(second, params)
            # the second turn's prefill fed only the last sampled token and the appended one
            assert fed[0] == 2
            turns[decode] = one + two
    finally:
        hook.remove()
    _assert_same(turns["dynamic"], turns["static"])


def test_graphs_need_a_cuda_device(policy64):
    model, tokenizer = policy64
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        HFEngine(model, tokenizer, decode="graphs")


def test_cuda_graphs_follow_the_device_and_on_is_refused_on_a_cpu_actor():
    from streamrl.actors.engines.hf import decode_mode
    from streamrl.configs import ConfigError, load_config

    def mode(*overrides):
        return decode_mode(load_config(None, list(overrides), env={}).actor)

    assert mode() == "dynamic"
    assert mode("actor.device=cuda:0") == "graphs"
    assert mode("actor.device=cuda", "actor.hf.cuda_graphs=on") == "graphs"
    assert mode("actor.device=cuda:0", "actor.hf.cuda_graphs=off") == "dynamic"
    with pytest.raises(ConfigError, match="actor.hf.cuda_graphs=on needs a CUDA actor.device"):
        load_config(None, ["actor.hf.cuda_graphs=on"], env={})


def test_a_graph_capture_that_fails_logs_why_once_and_decodes_on_eagerly(monkeypatch, caplog):
    """An op the installed torch or transformers cannot capture: the runner says why, drops its
    graphs and runs every later step eagerly, with the same logits the step gives. CUDA's calls
    are stand-ins here (no GPU); the capture itself raises as torch's does."""
    import contextlib
    import logging

    from streamrl.actors.engines.hf import decode_runners

    class Stream:
        def wait_stream(self, _other) -> None:
            pass

    @contextlib.contextmanager
    def failing_capture(*_args, **_kwargs):
        yield
        raise RuntimeError("operation not permitted when stream is capturing\nCUDA detail")

    cuda = decode_runners.torch.cuda
    monkeypatch.setattr(cuda, "Stream", lambda _device: Stream())
    monkeypatch.setattr(cuda, "current_stream", lambda _device: Stream())
    monkeypatch.setattr(cuda, "stream", lambda _s: contextlib.nullcontext())
    monkeypatch.setattr(cuda, "CUDAGraph", object)
    monkeypatch.setattr(cuda, "graph", failing_capture)
    monkeypatch.setattr(cuda, "synchronize", lambda _device: None)
    calls = []

    def step(bucket: int) -> torch.Tensor:
        calls.append(bucket)
        return torch.full((bucket,), float(len(calls)))

    runner = decode_runners.GraphRunner(step, torch.device("cpu"))
    with caplog.at_level(logging.WARNING, logger=decode_runners.__name__):
        first = runner(4)
        second = runner(2)
    # three warm-up runs, the failed capture's, then one eager run per step
    assert calls == [4] * 5 + [2] and first.tolist() == [5.0] * 4 and second.tolist() == [6.0] * 2
    assert runner.failed == "RuntimeError: operation not permitted when stream is capturing"
    assert not runner.graphs and runner.pool is None
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [f"CUDA graph capture failed, decoding without graphs: {runner.failed}"]


@pytest.mark.parametrize(
    "break_it",
    [
        lambda mp, cu: mp.delattr(cu, "CacheLayerMixin"),
        # the hook's earlier form: a cache_position tensor instead of the query length
        lambda mp, cu: mp.setattr(
            cu.CacheLayerMixin, "get_mask_sizes", lambda self, cache_position: (0, 0)
        ),
    ],
    ids=["no-layer-mixin", "older-mask-hook"],
)
def test_a_transformers_without_the_cache_hooks_decodes_dynamically_and_says_why(
    policy64, monkeypatch, caplog, break_it
):
    """``actor.hf.cuda_graphs`` checks what transformers provides, not its version: without the
    layered cache's hooks the engine logs the reason once and generates on the dynamic batch."""
    from transformers import cache_utils

    from streamrl.actors.engines.hf import engine as engine_module

    model, tokenizer = policy64
    params = SamplingParams(max_new_tokens=5, temperature=1.0)
    want = HFEngine(model, tokenizer, batch_slots=3, seed=7).generate(
        _requests(tokenizer, 3), params
    )
    # only while the engine chooses its batch: transformers' own DynamicCache needs the hooks
    with monkeypatch.context() as patched, caplog.at_level("WARNING", engine_module.__name__):
        break_it(patched, cache_utils)
        engine = HFEngine(model, tokenizer, batch_slots=3, seed=7, decode="static")
    assert engine.static is None
    reasons = [r.getMessage() for r in caplog.records if "dynamic batch" in r.getMessage()]
    assert len(reasons) == 1 and "transformers" in reasons[0], caplog.text
    _assert_same(want, engine.generate(_requests(tokenizer, 3), params))
