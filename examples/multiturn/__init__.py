"""A multi-turn CPU demo: reverse 3 digits, with a second attempt after feedback.

The model answers ``"314>"``; when it is wrong the environment shows which digits were right
(``"4?3>"``) and the model tries once more. ``build_policy`` is the reverse-digits demo's
warmed policy with a chat template that renders a user turn as its bare text, so the first
prompt is exactly what the warm start saw. The environment gives the reward: the mean over the
two attempts of the reverse-digits demo's shaped score, an attempt not needed scoring full; the
reward function ``reverse_digits_exact`` (weight 0) reports the last answer's exact-match rate.
"""

from streamrl.examples.multiturn.env import SecondAttempt, build_policy, hint

__all__ = ["SecondAttempt", "build_policy", "hint"]
