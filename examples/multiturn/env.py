"""The second-attempt environment and the demo policy's chat template."""

from __future__ import annotations

import os
from pathlib import Path

from streamrl.actors.environment import Step
from streamrl.examples.reverse_digits import build_policy as build_reverse_digits_policy
from streamrl.examples.reverse_digits.rewards import reverse_digits_reward
from streamrl.examples.reverse_digits.task import EOS, IM_END

# a user turn is its bare text (the warm start's prompt, "314>"); an assistant turn ends with
# <|im_end|>, which the environment's tokens carry after the model's end-of-sequence
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['content'] }}{% if m['role'] == 'assistant' %}"
    + IM_END
    + "{% endif %}{% endfor %}"
)
ATTEMPTS = 2


def hint(answer: str, attempt: str) -> str:
    """The feedback: the answer with the wrong digits masked, as a new prompt (``"4?3>"``)."""
    shown = "".join(
        a if i < len(attempt) and attempt[i] == a else "?" for i, a in enumerate(answer)
    )
    return shown + ">"


class SecondAttempt:
    """Done at once on the right answer; otherwise one hint and a second attempt.

    The reward is the mean over the two attempts of the reverse-digits demo's shaped score (per
    digit right, and stopping right after the answer); an attempt not needed scores full. So the
    first attempt is trained as in the single-turn demo, and the second to use the hint.
    """

    def reset(self, row: dict) -> list[dict]:
        self.answer = str(row["answer"])
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
            return Step(
                messages=[{"role": "user", "content": hint(self.answer, text)}], reward=score
            )
        return Step(reward=score, done=True)


def build_policy(path: str | os.PathLike, seed: int = 0) -> Path:
    """The ``model.build`` hook: the reverse-digits demo's warmed policy with ``CHAT_TEMPLATE``."""
    from transformers import AutoTokenizer

    path = Path(path)
    if (path / "config.json").exists():
        return path
    tmp = path.with_name(path.name + ".build")
    build_reverse_digits_policy(tmp, seed=seed)
    tokenizer = AutoTokenizer.from_pretrained(tmp)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(tmp)
    # atomic: concurrent builders never see half a folder
    os.replace(tmp, path)
    return path
