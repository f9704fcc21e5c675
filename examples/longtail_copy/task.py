"""Prompts of the long-tail copy task: heavy-tailed lengths, the answer is the prompt's digits."""

from __future__ import annotations

import random
import string

from streamrl.examples.reverse_digits.task import PROMPT_SUFFIX

MAX_DIGITS = 24
# P(n) ~ n^-ALPHA: median 2 digits, mean ~3.8, a batch of 16 prompts usually holds one of 10+
ALPHA = 1.5


def length_weights(max_digits: int = MAX_DIGITS, alpha: float = ALPHA) -> list[float]:
    """P(n) for n = 1..max_digits, proportional to n^-alpha (a truncated Zipf law)."""
    if max_digits < 1 or alpha < 0:
        raise ValueError(f"need max_digits >= 1 and alpha >= 0, got {max_digits}, {alpha}")
    raw = [n**-alpha for n in range(1, max_digits + 1)]
    total = sum(raw)
    return [w / total for w in raw]


def make_example(rng: random.Random, uniform: bool = False) -> dict[str, str]:
    """One prompt and answer; ``uniform`` draws the length uniformly instead (the warm start's)."""
    if uniform:
        digits = rng.randint(1, MAX_DIGITS)
    else:
        digits = rng.choices(range(1, MAX_DIGITS + 1), weights=length_weights())[0]
    number = "".join(rng.choice(string.digits) for _ in range(digits))
    return {"prompt": number + PROMPT_SUFFIX, "answer": number}


def warm_start_example(rng: random.Random) -> dict[str, str]:
    """The warm start sees every length equally often, so long answers learn where to stop too."""
    return make_example(rng, uniform=True)


def examples(size: int, seed: int = 0) -> list[dict[str, str]]:
    """``size`` examples drawn with the heavy-tailed lengths, reproducibly from ``seed``."""
    if size < 1:
        raise ValueError(f"need at least one example, got {size}")
    rng = random.Random(seed)
    return [make_example(rng) for _ in range(size)]
