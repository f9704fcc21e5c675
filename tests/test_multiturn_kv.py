"""The hf engine continues a multi-turn trajectory from its KV cache: the same tokens and log-probs
as a re-prefill at fixed weights (float64), only the appended tokens run through the model, a swap
between turns or inside one makes the next turn re-prefill under the new weights, and caches are
dropped when their trajectories end."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from multiturn_envs import FEEDBACK, ROW, Feedback, env_rollouts, terse_tokenizer

from streamrl.actors.engines.base import SamplingParams
from streamrl.actors.engines.hf.engine import HFEngine
from streamrl.learner.batching import Sample, collate
from streamrl.learner.engine import token_logprobs
from streamrl.policy.load import load_policy

# sampling runs in float32 (sampling.processed_logprobs): float64 logits that agree to ~1e-12
# round to float32 values at most one ulp apart, 2**-23 * |logit| < 4e-6 for |logit| < 32, and a
# log-softmax moves by at most two such steps
FLOAT32_TOLERANCE = 1e-5


class _Counting(HFEngine):
    """The real hf engine; records each forward pass's input length and each generate call."""

    def __init__(self, *args, reprefill: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.reprefill = reprefill
        self.lengths: list[list[int]] = []
        self.model.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, _module, _args, kwargs):
        if self.lengths:
            self.lengths[-1].append(kwargs["input_ids"].shape[1])

    def generate(self, requests, params, should_abort=None):
        self.lengths.append([])
        if self.reprefill:
            # the same requests without their sessions: every turn prefills its whole sequence
            requests = [type(r)(r.request_id, r.prompt_token_ids) for r in requests]
        return super().generate(requests, params, should_abort)


class _SwapAt:
    """Stages version 1 (the weights moved) at the ``poll``-th poll of the engine's ``call``-th
    generate call (0-based). The engine polls once per step: poll 0 comes before the turn's
    prefill, poll 1 after its first two tokens (the prefill's and the first decode step's)."""

    live_source = ""

    def __init__(self, engine, call: int, poll: int):
        self.engine, self.call, self.poll = engine, call, poll
        gen = torch.Generator().manual_seed(11)
        self.tensors = {
            n: p.detach() + 0.05 * torch.randn(p.shape, generator=gen, dtype=p.dtype)
            for n, p in engine.model.named_parameters()
        }
        self.polls = 0
        self.given = False

    def take_staged(self):
        if self.given or len(self.engine.lengths) != self.call + 1:
            return None
        self.polls += 1
        if self.polls - 1 < self.poll:
            return None
        self.given = True
        return 1, {n: t.clone() for n, t in self.tensors.items()}

    def applied(self, version, recycled=None):
        pass


@pytest.fixture(scope="module")
def tokenizer(demo_policy):
    tokenizer = terse_tokenizer(demo_policy)
    return tokenizer


def _engine(demo_policy, tokenizer, **kwargs) -> _Counting:
    return _Counting(load_policy(demo_policy).double(), tokenizer, batch_slots=8, seed=3, **kwargs)


def _roll_out(engine, tokenizer, size: int = 4):
    rollouts = env_rollouts(tokenizer, Feedback, max_turns=4, max_total_tokens=40)
    group = rollouts.start_group(ROW, size)
    params = SamplingParams(max_new_tokens=6, stop_token_ids=(tokenizer.eos_token_id,))
    assert rollouts.run(engine, group, params)
    assert [t.end for t in group] == ["done"] * size
    # every cache dropped with its trajectory
    assert len(engine.sessions) == 0
    return group, rollouts.renderer


def _longest_suffix(renderer) -> int:
    """The most tokens a continued turn feeds: the last sampled token and the observation."""
    stop = renderer.tokenizer.eos_token_id
    return 1 + max(len(renderer.observation(FEEDBACK, stop, s)) for s in (True, False))


def _learner_logprobs(model, prompt: list[int], t) -> np.ndarray:
    """The learner's float64 log-probs of a trajectory's model tokens under ``model``'s weights."""
    sample = Sample(
        np.asarray(prompt + t.tokens, dtype=np.int64),
        len(prompt),
        np.asarray(t.logprobs, dtype=np.float32),
        np.asarray(t.versions, dtype=np.int64),
        0.0,
        0.0,
        "g",
        loss_mask=np.asarray(t.mask, dtype=np.uint8),
    )
    batch = collate([sample], 0)
    with torch.no_grad():
        logprobs = token_logprobs(model, batch, 1.0)
    return logprobs[batch.completion_mask].numpy()


def test_kv_continuation_gives_the_tokens_and_logprobs_of_a_reprefill(demo_policy, tokenizer):
    continued = _engine(demo_policy, tokenizer)
    reprefilled = _engine(demo_policy, tokenizer, reprefill=True)
    a, renderer = _roll_out(continued, tokenizer)
    b, _ = _roll_out(reprefilled, tokenizer)
    for x, y in zip(a, b, strict=True):
        assert x.tokens == y.tokens and x.mask == y.mask and x.versions == y.versions
        np.testing.assert_allclose(x.logprobs, y.logprobs, rtol=0, atol=FLOAT32_TOLERANCE)
    prompt = len(a[0].prompt)
    # turn 1 prefills the prompt; later turns feed only what they append to the kept cache ...
    assert max(continued.lengths[0]) == prompt
    assert all(max(call) <= _longest_suffix(renderer) for call in continued.lengths[1:])
    # ... where a re-prefill feeds the whole sequence
    assert max(reprefilled.lengths[2]) > prompt + 6
    # the behaviour log-probs are the learner's on the same weights (float64 model)
    for t in a:
        mask = np.asarray(t.mask, dtype=bool)
        np.testing.assert_allclose(
            np.asarray(t.logprobs)[mask],
            _learner_logprobs(continued.model, t.prompt, t),
            rtol=0,
            atol=FLOAT32_TOLERANCE,
        )


def _turns(t) -> np.ndarray:
    """Each token's turn: 1 from the first model token, +1 at each later model turn's first token."""
    return np.cumsum(np.diff(np.asarray([0] + t.mask)) == 1)


@pytest.mark.parametrize("poll", [0, 1], ids=["between-turns", "inside-a-turn"])
def test_a_swap_makes_the_next_turn_reprefill_under_the_new_weights(demo_policy, tokenizer, poll):
    engine = _engine(demo_policy, tokenizer)
    # version 1 arrives in turn 2: before its prefill (poll 0), or after its first two tokens
    engine.weight_source = _SwapAt(engine, call=1, poll=poll)
    group, renderer = _roll_out(engine, tokenizer)
    assert engine.weight_source.given and engine.version == 1
    suffix, whole = _longest_suffix(renderer), len(group[0].prompt) + 6
    # the first turn under version 1 throughout re-prefills every sequence, and the next continues
    # from the caches it kept (between turns: turn 2 then 3; inside turn 2: turn 3 then 4)
    fresh = 2 if poll == 0 else 3
    assert max(engine.lengths[fresh - 2]) <= (len(group[0].prompt) if fresh == 2 else suffix)
    assert max(engine.lengths[fresh - 1]) > whole
    assert all(max(call) <= suffix for call in engine.lengths[fresh:])
    v1 = load_policy(demo_policy).double()
    with torch.no_grad():
        for name, param in v1.named_parameters():
            param.copy_(engine.weight_source.tensors[name])
    straddled = False
    for t in group:
        model = np.asarray(t.mask, dtype=bool)
        turns = _turns(t)[model]
        versions = np.asarray(t.versions)[model]
        assert set(versions[turns < 2]) == {0} and set(versions[turns > 2]) == {1}
        # turn 2: its tokens sampled before the swap (none, or the first two) tagged 0, the rest 1
        n, before = int((turns == 2).sum()), 2 * poll
        assert versions[turns == 2].tolist() == [0] * min(before, n) + [1] * max(0, n - before)
        straddled |= n > before > 0
        # from the first turn under version 1 on, the learner's log-probs under version 1: the
        # kept caches were computed under it too
        late = turns >= fresh
        np.testing.assert_allclose(
            np.asarray(t.logprobs)[model][late],
            _learner_logprobs(v1, t.prompt, t)[late],
            rtol=0,
            atol=FLOAT32_TOLERANCE,
        )
    if poll:
        assert straddled, "no trajectory's turn 2 outlived two tokens"


def test_an_aborted_rollout_drops_its_kept_caches(demo_policy, tokenizer):
    engine = _engine(demo_policy, tokenizer)
    rollouts = env_rollouts(tokenizer, Feedback, max_turns=4, max_total_tokens=40)
    group = rollouts.start_group(ROW, 3)
    params = SamplingParams(max_new_tokens=6, stop_token_ids=(tokenizer.eos_token_id,))
    kept = []

    def stop_in_turn_2() -> bool:
        # the first poll of turn 2 comes before its prefill takes the caches turn 1 kept
        if len(engine.lengths) < 2:
            return False
        kept.append(len(engine.sessions))
        return True

    assert not rollouts.run(engine, group, params, stop_in_turn_2)
    # turn 1 ended with every trajectory's cache kept; none is left after the abort
    assert kept == [3] and len(engine.sessions) == 0
