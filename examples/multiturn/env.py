"""The second-attempt environment, its policy (chat template and warm start) and its reward parts."""

from __future__ import annotations

import os
import random
import string
from pathlib import Path

from streamrl.actors.environment import Step
from streamrl.examples.reverse_digits import assets
from streamrl.examples.reverse_digits.rewards import reverse_digits_reward
from streamrl.examples.reverse_digits.task import EOS, IM_END, make_example

# a user turn is its bare text (the warm start's prompt, "314>"); an assistant turn ends with
# <|im_end|>, which the environment's tokens carry after the model's end-of-sequence
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['content'] }}{% if m['role'] == 'assistant' %}"
    + IM_END
    + "{% endif %}{% endfor %}"
)
ATTEMPTS = 2
# the single-turn demo's warm start for each of the two contexts (half the examples are each): with
# its 60 steps shared between them the first turn's format was learned half as far, and RL sat on
# the chance plateau for up to 500 steps (docs/multiturn.md)
WARM_START_STEPS = 2 * assets.WARM_START_STEPS


def hint(answer: str, attempt: str) -> str:
    """The answer with the digits the attempt got wrong masked (``"4?3"``)."""
    return "".join(a if i < len(attempt) and attempt[i] == a else "?" for i, a in enumerate(answer))


def feedback(question: str, answer: str, attempt: str) -> str:
    """The second prompt: the hint, then the question again (``"4?3:314>"``).

    Asked again in the first prompt's shape, the answer's digits sit at the same distances from
    the question's as in the first turn, so what the model learns there carries over; the hint's
    digit for each answer position sits at one fixed distance before it, a copy a tiny model
    learns quickly.
    """
    return hint(answer, attempt) + ":" + question


class SecondAttempt:
    """Done at once on the right answer; otherwise feedback and a second attempt.

    The reward is the mean over the two attempts of the reverse-digits demo's shaped score (per
    digit right, and stopping right after the answer); an attempt not needed scores full. So the
    first attempt is trained as in the single-turn demo, and the second to use the feedback.
    """

    def reset(self, row: dict) -> list[dict]:
        self.answer = str(row["answer"])
        self.question = row["messages"][-1]["content"]
        self.attempts = 0
        return row["messages"]

    def step(self, turn: dict) -> Step:
        self.attempts += 1
        raw = turn["raw_content"]
        score = sum(reverse_digits_reward(raw, self.answer).values()) / ATTEMPTS
        text = raw.removesuffix(EOS)
        if text == self.answer and raw.endswith(EOS):
            return Step(reward=score + (ATTEMPTS - self.attempts) / ATTEMPTS, done=True)
        if self.attempts < ATTEMPTS:
            message = {"role": "user", "content": feedback(self.question, self.answer, text)}
            return Step(messages=[message], reward=score)
        return Step(reward=score, done=True)


def second_turn_exact(messages, answer, **_) -> float:
    """The reward part ``second_turn_exact``: 1 when the last answer is right *and* came at the
    second attempt (weight 0: over ``reverse_digits_exact``, the share of successes at turn 2)."""
    turns = [m for m in messages if m["role"] == "assistant"]
    last = turns[-1].get("raw_content", "")
    return float(len(turns) == ATTEMPTS and last == str(answer) + EOS)


def make_two_turn_example(rng: random.Random) -> dict[str, str]:
    """A warm-start example of either turn's context: the question, or the question, a random
    first attempt and its feedback (the warm start teaches the format, not the answer)."""
    ex = make_example(rng)
    if rng.random() < 0.5:
        return ex
    attempt = "".join(rng.choice(string.digits) for _ in range(len(ex["answer"])))
    second = feedback(ex["prompt"], ex["answer"], attempt)
    return {"prompt": ex["prompt"] + attempt + EOS + IM_END + second, "answer": ex["answer"]}


def build_policy(
    path: str | os.PathLike, seed: int = 0, warm_start_steps: int = WARM_START_STEPS
) -> Path:
    """The task's policy (``streamrl example multiturn``): the reverse-digits demo's tiny policy,
    its format warm start taught on both turns' contexts, with ``CHAT_TEMPLATE``."""
    from transformers import AutoTokenizer

    path = Path(path)
    if (path / "config.json").exists():
        return path
    with assets.staging(path) as work:
        tmp = assets.build_policy(
            work / "policy", seed, warm_start_steps, make=make_two_turn_example
        )
        tokenizer = AutoTokenizer.from_pretrained(tmp)
        tokenizer.chat_template = CHAT_TEMPLATE
        tokenizer.save_pretrained(tmp)
        assets.replace_into(tmp, path)
    return path
