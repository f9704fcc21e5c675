"""Multi-turn trajectories: token-in/token-out with the hf engine, the loss mask on the wire and in
the learner's loss, versions across a weight swap between turns, and failing environment steps."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from broker_helpers import limits_of
from multiturn_envs import ROW, Feedback, env_rollouts, lookup, terse_tokenizer

from streamrl.actors.engines.base import SamplingParams
from streamrl.actors.engines.hf.engine import HFEngine
from streamrl.actors.environment import Step, ToolEnvironment, parse_tool_calls
from streamrl.actors.trajectory import Renderer
from streamrl.broker.wire import Completion, RolloutGroup, WireError, decode_group, encode_group
from streamrl.configs.schema import AlgoConfig
from streamrl.learner.batching import collate, samples_from_group
from streamrl.learner.step import _loss, counted_tokens, token_logprobs
from streamrl.policy.load import load_policy, load_tokenizer


class _Recording(HFEngine):
    """The real hf engine, keeping every request and output it saw."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = []

    def generate(self, requests, params, should_abort=None):
        outputs = super().generate(requests, params, should_abort)
        self.calls.append(([list(r.prompt_token_ids) for r in requests], outputs))
        return outputs


class _SwapBeforeCall:
    """Stages version 1 at the first poll of the engine's ``swap_call``-th generate call."""

    live_source = ""

    def __init__(self, model, engine_calls):
        self.engine_calls = engine_calls
        self.tensors = {n: p.detach() + 0.01 for n, p in model.named_parameters()}
        self.given = False

    def take_staged(self):
        if not self.given and len(self.engine_calls()) == 1:
            self.given = True
            return 1, self.tensors
        return None

    def applied(self, version, recycled=None):
        pass


@pytest.fixture(scope="module")
def policy(demo_policy):
    tokenizer = terse_tokenizer(demo_policy)
    return load_policy(demo_policy), tokenizer


def _params(tokenizer):
    return SamplingParams(max_new_tokens=6, stop_token_ids=(tokenizer.eos_token_id,))


def test_trained_tokens_are_the_engine_turns_plus_the_rendered_observations(policy):
    model, tokenizer = policy
    engine = _Recording(model, tokenizer, batch_slots=4, seed=5)
    engine.weight_source = _SwapBeforeCall(model, lambda: engine.calls)
    rollouts = env_rollouts(tokenizer, Feedback, max_turns=4, max_total_tokens=40)
    group = rollouts.start_group(ROW, 3)
    assert rollouts.run(engine, group, _params(tokenizer))
    renderer = rollouts.renderer
    assert [t.end for t in group] == ["done"] * 3
    assert len(engine.calls) == 3
    for j, t in enumerate(group):
        assert t.prompt == renderer.prompt(ROW["messages"])
        expected, mask, versions = [], [], []
        for turn, (sent, outputs) in enumerate(engine.calls):
            # the engine was asked to continue from exactly the tokens so far
            assert sent[j] == t.prompt + expected
            out = outputs[j]
            expected += out.token_ids.tolist()
            mask += [1] * len(out.token_ids)
            versions += out.versions.tolist()
            # the weight swap between turn 1 and turn 2 shows in the versions of turn 2 only
            assert set(out.versions.tolist()) == {0 if turn == 0 else 1}
            if turn < 2:
                env = renderer.observation(
                    [{"role": "user", "content": "no"}],
                    int(out.token_ids[-1]),
                    out.finish_reason == "stop",
                )
                expected += env
                mask += [0] * len(env)
                versions += [versions[-1]] * len(env)
        # through the wire and into the learner's tensors, token by token
        completion = t.output(str(j))
        sent = RolloutGroup(
            "g",
            "row0",
            "a",
            0,
            np.asarray(t.prompt, dtype=np.int32),
            [
                Completion(
                    completion.token_ids,
                    completion.logprobs,
                    completion.versions,
                    1.0,
                    completion.finish_reason,
                    loss_mask=completion.meta["loss_mask"],
                )
            ],
        )
        (sample,) = samples_from_group(decode_group(encode_group(sent)), [1.0])
        assert sample.input_ids.tolist() == t.prompt + expected
        assert sample.versions.tolist() == versions
        mb = collate([sample], pad_id=0)
        trained = mb.completion_mask[0, len(t.prompt) - 1 :].tolist()
        assert trained == [bool(m) for m in mask]
        # the text the environment saw is the model's tokens decoded, never the other way round
        assert t.messages[1]["raw_content"] == tokenizer.decode(
            engine.calls[0][1][j].token_ids.tolist(), skip_special_tokens=False
        )


def test_environment_tokens_get_exactly_zero_gradient_through_the_learners_loss(
    policy, demo_policy
):
    _, tokenizer = policy
    # the weights the learner starts from: ratios near 1, so no model token is clipped
    engine = HFEngine(load_policy(demo_policy), tokenizer, batch_slots=4, seed=6)
    rollouts = env_rollouts(tokenizer, Feedback, max_turns=3, max_total_tokens=40)
    group = rollouts.start_group(ROW, 2)
    assert rollouts.run(engine, group, _params(tokenizer))
    outs = [t.output(str(j)) for j, t in enumerate(group)]

    def micro_batch(env_behaviour: float):
        comps = []
        for o in outs:
            logprobs = o.logprobs.copy()
            # a behaviour log-prob that would push the environment's tokens hard if they counted
            logprobs[o.meta["loss_mask"] == 0] = env_behaviour
            comps.append(
                Completion(o.token_ids, logprobs, o.versions, 0.0, loss_mask=o.meta["loss_mask"])
            )
        g = RolloutGroup("g", "p", "a", 0, np.asarray(group[0].prompt, np.int32), comps)
        samples = samples_from_group(decode_group(encode_group(g)), [1.0, -1.0])
        return samples, collate(samples, pad_id=0)

    learner_model = load_policy(demo_policy).double()
    algo = AlgoConfig()
    grads = []
    for env_behaviour in (0.0, -5.0):
        samples, mb = micro_batch(env_behaviour)
        learner_model.zero_grad()
        logprobs = token_logprobs(learner_model, mb, 1.0)
        logprobs.retain_grad()
        normalizer = float(counted_tokens(samples, 0, algo.max_staleness)[0])
        loss, _ = _loss(algo, logprobs, None, mb, 0, None, None, normalizer)
        loss.backward()
        env = mb.attention_mask[:, 1:].bool() & ~mb.completion_mask
        env[:, : len(group[0].prompt) - 1] = False
        assert env.any()
        assert torch.equal(logprobs.grad[env], torch.zeros_like(logprobs.grad[env]))
        assert (logprobs.grad[mb.completion_mask] != 0).all()
        grads.append([p.grad.clone() for p in learner_model.parameters()])
    # the environment tokens' behaviour log-probs do not reach the update at all
    for a, b in zip(*grads, strict=True):
        assert torch.equal(a, b)
    assert any(bool(g.abs().sum() > 0) for g in grads[0])
    assert counted_tokens(samples, 0, algo.max_staleness)[0] == sum(
        int(o.meta["loss_mask"].sum()) for o in outs
    )


class _Raises(Feedback):
    def step(self, turn):
        raise RuntimeError("tool broke")


class _Garbage(Feedback):
    def step(self, turn):
        return {"messages": "not a step"}


class _BadReward(Feedback):
    def step(self, turn):
        return Step(messages=[{"role": "user", "content": "x"}], reward=float("nan"))


class _NoMessages(Feedback):
    def step(self, turn):
        return Step(messages=[{"role": "wizard", "content": 3}])


RELEASE = threading.Event()


class _Hangs(Feedback):
    def step(self, turn):
        RELEASE.wait()
        return Step(done=True)


@pytest.mark.parametrize(
    ("env", "reason"),
    [
        (_Raises, "error"),
        (_Garbage, "invalid"),
        (_BadReward, "invalid"),
        (_NoMessages, "invalid"),
        (_Hangs, "timeout"),
    ],
)
def test_a_failing_step_ends_its_trajectory_with_a_reason_and_the_rest_go_on(policy, env, reason):
    model, tokenizer = policy
    RELEASE.clear()
    engine = HFEngine(model, tokenizer, batch_slots=4, seed=7)
    # the hung step waits until released, so it runs past any timeout; a well-behaved one is far
    # inside this one
    bad = env_rollouts(tokenizer, env, step_timeout_s=2.0, max_total_tokens=40)
    good = env_rollouts(tokenizer, Feedback, max_total_tokens=40)
    try:
        trajectories = bad.start_group(ROW, 2) + good.start_group(ROW, 2)
        assert bad.run(engine, trajectories, _params(tokenizer))
    finally:
        RELEASE.set()
    assert [t.end for t in trajectories] == [reason, reason, "done", "done"]
    assert [t.turns for t in trajectories] == [1, 1, 3, 3]
    for t in trajectories[:2]:
        out = t.output("0")
        # ended after one model turn, nothing appended for the failed step; flagged truncated
        assert out.meta["loss_mask"].tolist() == [1] * len(out.token_ids)
        assert out.finish_reason == "length" and t.truncated


def test_limits_truncate_a_trajectory(policy):
    model, tokenizer = policy
    engine = HFEngine(model, tokenizer, batch_slots=4, seed=8)
    turns = env_rollouts(tokenizer, Feedback, max_turns=2, max_total_tokens=60)
    group = turns.start_group(ROW, 2)
    assert turns.run(engine, group, _params(tokenizer))
    assert [(t.end, t.turns) for t in group] == [("max_turns", 2)] * 2
    tokens = env_rollouts(tokenizer, Feedback, max_turns=4, max_total_tokens=12)
    group = tokens.start_group(ROW, 2)
    assert tokens.run(engine, group, _params(tokenizer))
    for t in group:
        assert t.end == "max_total_tokens" and len(t.tokens) <= 12


def test_parse_tool_calls():
    text = (
        '<tool_call>\n{"name": "lookup", "arguments": {"key": "a"}}\n</tool_call> and '
        "<tool_call>{oops}</tool_call><tool_call>[1]</tool_call>"
    )
    calls = parse_tool_calls(text)
    assert calls[0] == {"name": "lookup", "arguments": {"key": "a"}}
    assert "error" in calls[1] and "error" in calls[2]


def _group(mask, n: int = 3) -> RolloutGroup:
    n = n if mask is None else len(mask)
    return RolloutGroup(
        "g",
        "p",
        "a",
        0,
        np.array([1, 2], np.int32),
        [
            Completion(
                np.arange(n, dtype=np.int32),
                np.zeros(n, np.float32),
                np.zeros(n, np.int32),
                0.0,
                loss_mask=None if mask is None else np.asarray(mask, np.uint8),
            )
        ],
    )


def test_wire_loss_mask_round_trips_and_single_turn_entries_are_unchanged():
    decoded = decode_group(encode_group(_group([1, 1, 0, 0, 1])))
    assert decoded.completions[0].loss_mask.tolist() == [1, 1, 0, 0, 1]
    plain = encode_group(_group(None))
    assert b"lm" not in plain
    assert decode_group(plain).completions[0].loss_mask is None


@pytest.mark.parametrize(
    ("mask", "match"),
    [([1, 2, 0], "other than 0 or 1"), ([0, 0, 0], "no token of the model")],
)
def test_wire_rejects_bad_loss_masks(mask, match):
    with pytest.raises(WireError, match=match):
        decode_group(encode_group(_group(mask)))


def test_wire_rejects_a_loss_mask_of_the_wrong_length():
    import msgpack

    obj = msgpack.unpackb(encode_group(_group([1, 0, 1])))
    obj["lm"] = obj["lm"][:2]
    with pytest.raises(WireError, match="2 loss-mask values for 3 tokens"):
        decode_group(msgpack.packb(obj))


def test_the_consumer_bounds_a_trajectory_by_env_max_total_tokens():
    from streamrl.broker.semantics import check_group
    from streamrl.configs import Config

    single = Config.model_validate({"rollout": {"max_new_tokens": 4}})
    multi = Config.model_validate(
        {
            "rollout": {"max_new_tokens": 4, "group_size": 1},
            "env": {"name": "m:E", "max_total_tokens": 6},
        }
    )
    assert limits_of(single).max_completion_tokens == 4
    limits = limits_of(multi)
    check_group(_group([1, 0, 0, 1, 1, 1]), limits)
    with pytest.raises(WireError, match="env.max_total_tokens=6"):
        check_group(_group([1, 0, 0, 1, 1, 1, 1]), limits)


class _Lookup(ToolEnvironment):
    tools = [lookup]

    def reset(self, row):
        return row["messages"]

    def answer(self, turn):
        return Step(reward=float(turn["content"] == "42"), done=True)


# a Hermes-style template: the tools' JSON schemas in the first turn, tool results as responses
TOOL_TEMPLATE = (
    "{% if tools %}<|im_start|>{% for t in tools %}{{ t | tojson }}{% endfor %}<|im_end|>{% endif %}"
    "{% for m in messages %}<|im_start|>{% if m['role'] == 'tool' %}<tool_response>{{ m['content'] }}"
    "</tool_response>{% else %}{{ m['content'] }}{% endif %}<|im_end|>{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>{% endif %}"
)


def test_tools_are_described_through_the_chat_template_and_their_calls_answered(demo_policy):
    tokenizer = load_tokenizer(demo_policy)
    tokenizer.chat_template = TOOL_TEMPLATE
    renderer = Renderer(tokenizer, _Lookup.tools)
    prompt = tokenizer.decode(renderer.prompt(ROW["messages"]), skip_special_tokens=False)
    # (the demo's character tokenizer does not keep spaces)
    prompt = prompt.replace(" ", "")
    assert '"name":"lookup"' in prompt and '"description":"Lookakeyupinthetable."' in prompt
    env = _Lookup()
    env.reset(ROW)
    text = '<tool_call>{"name": "lookup", "arguments": {"key": "a"}}</tool_call>'
    turn = {"content": text, "raw_content": text, "tool_calls": parse_tool_calls(text)}
    step = env.step(turn)
    assert step.messages == [{"role": "tool", "name": "lookup", "content": "42"}] and not step.done
    ids = renderer.observation(step.messages, tokenizer.eos_token_id, True)
    assert tokenizer.decode(ids, skip_special_tokens=False) == (
        "<|im_end|><|im_start|><tool_response>42</tool_response><|im_end|><|im_start|>"
    )
    # a call of an unknown tool or with bad arguments is answered with the error, for the model
    bad = '<tool_call>{"name": "nope", "arguments": {}}</tool_call><tool_call>{"name": "lookup", "arguments": {"k": 1}}</tool_call>'
    messages = env.step({"raw_content": bad, "tool_calls": parse_tool_calls(bad)}).messages
    assert [m["content"].startswith("error:") for m in messages] == [True, True]
    assert env.step({"content": "42", "tool_calls": []}) == Step(reward=1.0, done=True)
