"""Environments the multi-turn actor test names as ``multiturn_envs:Class`` (tests/ is on its path)."""

from __future__ import annotations

from streamrl.actors.environment import Step
from streamrl.actors.sources.environment import Rollouts
from streamrl.actors.trajectory import Renderer, assistant_turn
from streamrl.configs.schema import EnvConfig
from streamrl.examples.multiturn import SecondAttempt, build_policy
from streamrl.examples.reverse_digits import assets
from streamrl.policy.load import load_tokenizer

# the tests need the policy's chat template and some of its format, not the demo's learning: the
# single-turn demo's warm start, half the multi-turn demo's and half its build time
TEST_WARM_START_STEPS = assets.WARM_START_STEPS
# the demo tokenizer spells "assistant" in 9 tokens; a terse template fits 3 turns in its 64 positions
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>{% endif %}"
)
ROW = {"messages": [{"role": "user", "content": "123>"}], "answer": "321"}


def terse_tokenizer(policy):
    """The tokenizer of the policy folder ``policy`` with ``TEMPLATE`` as its chat template."""
    tokenizer = load_tokenizer(policy)
    tokenizer.chat_template = TEMPLATE
    return tokenizer


def build_multiturn_policy(path):
    """The demo's multi-turn policy folder at ``path``, with the tests' shorter warm start (the
    session's copy: conftest's ``multiturn_policy`` fixture)."""
    return build_policy(path, warm_start_steps=TEST_WARM_START_STEPS)


class Flaky(SecondAttempt):
    """The demo's environment, except that its step raises for answers starting with an even digit."""

    def step(self, turn):
        if int(self.answer[0]) % 2 == 0:
            raise RuntimeError("tool broke")
        return super().step(turn)


# what Feedback says after each wrong answer
FEEDBACK = [{"role": "user", "content": "no"}]


class Feedback:
    """Says "no" twice, then done with reward 1: three model turns, whatever the model writes."""

    def reset(self, row):
        self.steps = 0
        return row["messages"]

    def step(self, turn):
        self.steps += 1
        if self.steps == 3:
            return Step(reward=1.0, done=True)
        return Step(messages=FEEDBACK)


def lookup(key: str) -> str:
    """Look a key up in the table.

    Args:
        key: the key to look up
    """
    return {"a": "42"}[key]


def env_rollouts(tokenizer, factory, **env) -> Rollouts:
    """``Rollouts`` of the environment ``factory`` makes, as an hf actor runs them (``env``: the
    ``env.*`` limits; its tools, if it has any, described to the model)."""
    return Rollouts(
        EnvConfig(name="unused:name", **env),
        factory,
        Renderer(tokenizer, getattr(factory, "tools", ())),
        lambda output: assistant_turn(tokenizer, output),
    )
