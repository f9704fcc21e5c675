"""The demo's verifiable rewards, named in ``configs/demo_cpu.yaml`` as ``module:function``.

They read the completion *with* its special tokens (``raw_content``): the character
tokenizer's pad and chat tokens are outputs the policy can sample, and they are wrong.
"""

from __future__ import annotations

from streamrl.actors.rewards import completion_turn
from streamrl.examples.reverse_digits.task import EOS

# the reward part of ``reverse_digits_exact``: the exact-match rate the demo's target asks for
EXACT_PART = "reverse_digits_exact"


def _stopped(completion: str) -> tuple[str, bool]:
    """The completion without its final EOS, and whether it had one."""
    stopped = completion.endswith(EOS)
    return (completion[: -len(EOS)] if stopped else completion), stopped


def reverse_digits_reward(completion: str, answer: str) -> dict[str, float]:
    """0.9 x fraction of answer positions right + 0.1 x stopped right after the answer; exact = 1.0.

    ``completion`` is the decoded text *with* special tokens, ending in EOS when
    the completion stopped on it (see streamrl.actors.rewards): a sampled ``<|pad|>`` or
    ``<|im_end|>`` occupies positions like any other token, so ``4<|pad|>13``
    is not the answer ``413``.
    """
    text, stopped = _stopped(completion)
    right = sum(1 for a, b in zip(text, answer, strict=False) if a == b)
    position = right / len(answer)
    stop = 1.0 if stopped and len(text) == len(answer) else 0.0
    return {"position": 0.9 * position, "stop": 0.1 * stop}


def _raw_text(messages) -> str:
    """The assistant turn's text with special tokens kept; without ``raw_content`` (a caller that
    only has the clean text) EOS is appended on a stop."""
    turn = completion_turn(messages)
    text = turn.get("raw_content")
    if text is None:
        text = turn["content"] + (EOS if turn.get("finish_reason") == "stop" else "")
    return text


def reverse_digits(messages, answer, **_) -> dict[str, float]:
    """The reward ``reverse_digits``: the shaped reward above on the assistant turn."""
    return reverse_digits_reward(_raw_text(messages), str(answer))


def reverse_digits_exact(messages, answer, **_) -> float:
    """The reward ``reverse_digits_exact``: 1 for exactly the answer, then EOS.

    The demo preset gives it weight 0: its mean is reported per step and is a target bar
    (``run.target_parts``), without changing the reward that is trained.
    """
    text, stopped = _stopped(_raw_text(messages))
    return float(stopped and text == str(answer))
