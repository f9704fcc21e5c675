"""The long-tail task's rewards, named in ``configs/longtail_cpu.yaml``.

The demo's reward already compares the completion with the answer position by
position (0.9 x the fraction right + 0.1 x stopped right after it), whatever the
answer is: copying is that reward with the prompt's digits as the answer.
"""

from __future__ import annotations

from streamrl.examples.reverse_digits.rewards import reverse_digits, reverse_digits_exact

# the reward part the long-tail target asks for: the exact-copy rate
EXACT_PART = "copy_digits_exact"


def copy_digits(messages, answer, **_) -> dict[str, float]:
    """The reward ``copy_digits``: shaped per position, 1.0 for an exact copy then EOS."""
    return reverse_digits(messages, answer)


def copy_digits_exact(messages, answer, **_) -> float:
    """The reward ``copy_digits_exact`` (weight 0 in the preset): 1 for an exact copy then EOS."""
    return reverse_digits_exact(messages, answer)
