"""A multi-turn CPU demo: reverse 3 digits, with a second attempt after feedback.

The model answers ``"314>"``; when it is wrong the environment shows which digits were right and
asks again (``"4?3:314>"``), and the model tries once more. ``build_policy`` is the
reverse-digits demo's tiny policy with its format warm start taught on both turns' contexts and
a chat template that renders a user turn as its bare text. The environment gives the reward: the
mean over the two attempts of the reverse-digits demo's shaped score, an attempt not needed
scoring full; the reward functions ``reverse_digits_exact`` and ``second_turn_exact`` (weight 0)
report the last answer's exact-match rate and the part of it that came at the second attempt.
"""

from streamrl.examples.multiturn.env import (
    SecondAttempt,
    build_policy,
    feedback,
    hint,
    second_turn_exact,
)

__all__ = ["SecondAttempt", "build_policy", "feedback", "hint", "second_turn_exact"]
