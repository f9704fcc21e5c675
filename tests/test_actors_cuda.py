"""The hf engine's CUDA-graph decode (``actor.hf.cuda_graphs``) on a real GPU: replayed graphs give
the eager static batch's tokens, a weight swap (copied in place) shows in the very next replay's
logits, and the graphs switch buckets as rows finish.

Skipped without CUDA (CI has no GPU); the static batch itself, run eagerly, is tested on CPU
against the dynamic batch in ``test_actors_static_decode.py``."""

from __future__ import annotations

import copy

import pytest
import torch

from streamrl.actors.engines.base import Request, SamplingParams
from streamrl.actors.engines.hf.engine import HFEngine
from streamrl.policy.load import load_policy, load_tokenizer
from streamrl.weightsync.subscriber import swap_into_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

PROMPTS = ["314>", "12>", "98765>", "1>", "4444>", "abcdefgh>", "70>"]


@pytest.fixture(scope="module")
def policy(demo_policy):
    return load_policy(demo_policy, torch.float32, "cuda"), load_tokenizer(demo_policy)


def _requests(tokenizer, n: int) -> list[Request]:
    return [Request(str(i), tokenizer(PROMPTS[i % len(PROMPTS)])["input_ids"]) for i in range(n)]


def _moved(model) -> dict[str, torch.Tensor]:
    gen = torch.Generator(device="cuda").manual_seed(0)
    return {
        n: p.detach() + 0.05 * torch.randn(p.shape, generator=gen, device="cuda", dtype=p.dtype)
        for n, p in model.named_parameters()
    }


def test_replayed_graphs_give_the_eager_static_tokens_and_switch_buckets_as_rows_finish(policy):
    model, tokenizer = policy
    # top_k=1: greedy, so the comparison does not hang on a sampling draw
    params = SamplingParams(max_new_tokens=12, top_k=1, stop_token_ids=(tokenizer.eos_token_id,))
    outputs = {}
    for decode in ("static", "graphs"):
        engine = HFEngine(model, tokenizer, batch_slots=8, seed=1, decode=decode)
        # a second call of 3 requests: the graphs outlive a call, and it runs at bucket 4 or less
        outputs[decode] = engine.generate(_requests(tokenizer, 21), params) + engine.generate(
            _requests(tokenizer, 3), params
        )
    for a, b in zip(outputs["static"], outputs["graphs"], strict=True):
        assert a.token_ids.tolist() == b.token_ids.tolist() and a.finish_reason == b.finish_reason
    # full batches ran at 8 rows, fewer rows at smaller buckets: one graph per bucket used
    captured = set(engine.static.runner.graphs)
    assert 8 in captured and 4 in captured, captured


def test_a_swap_between_replays_shows_in_the_next_steps_logits(policy):
    """A graph holds the parameters by address: the in-place swap must reach the next replay,
    which must then equal an eager step under the new weights."""
    base, tokenizer = policy
    params = SamplingParams(max_new_tokens=8)
    prompts = [r.prompt_token_ids for r in _requests(tokenizer, 3)]
    logits = {}
    for decode in ("static", "graphs"):
        model = copy.deepcopy(base)
        engine = HFEngine(model, tokenizer, batch_slots=4, decode=decode)
        with torch.inference_mode():
            batch = engine._batch(params)
            first = batch.prefill(prompts, [0, 1, 2], [None] * 3)
            batch.set_next_tokens([0, 1, 2], first.argmax(-1))
            before = batch.decode().clone()
            batch.set_next_tokens([0, 1, 2], before.argmax(-1))
            swap_into_model(model, _moved(model), in_place=engine.static.holds_addresses)
            after = batch.decode().clone()
        logits[decode] = (before, after)
    torch.testing.assert_close(logits["graphs"][0], logits["static"][0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(logits["graphs"][1], logits["static"][1], rtol=1e-4, atol=1e-4)
    # the moved weights changed the logits far beyond the two runners' rounding
    assert (logits["graphs"][1] - logits["static"][0]).abs().max() > 1e-2


class _SwapAt:
    """Lends version 1 (``staged``) at the ``at``-th poll, as a subscriber does."""

    live_source = ""

    def __init__(self, staged: dict[str, torch.Tensor], at: int) -> None:
        self.staged, self.at, self.polls, self.recycled = staged, at, 0, None

    def take_staged(self):
        self.polls += 1
        return (1, self.staged) if self.polls == self.at else None

    def applied(self, version, recycled=None):
        self.recycled = recycled


def test_a_swap_mid_generate_keeps_the_versions_and_tokens_of_the_eager_static_batch(policy):
    base, tokenizer = policy
    params = SamplingParams(max_new_tokens=10, top_k=1)
    outputs = {}
    for decode in ("static", "graphs"):
        model = copy.deepcopy(base)
        source = _SwapAt(_moved(model), at=4)
        engine = HFEngine(model, tokenizer, batch_slots=4, weight_source=source, decode=decode)
        outputs[decode] = engine.generate(_requests(tokenizer, 4), params)
        # copied in place: the staged tensors themselves went back for the next version
        assert all(source.recycled[n] is t for n, t in source.staged.items())
    for a, b in zip(outputs["static"], outputs["graphs"], strict=True):
        assert a.token_ids.tolist() == b.token_ids.tolist()
        assert b.versions.tolist() == [0] * 4 + [1] * 6
