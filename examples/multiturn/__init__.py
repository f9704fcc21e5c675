"""A multi-turn CPU demo: reverse 3 digits, with a second attempt after feedback.

The model answers ``"314>"``; when it is wrong the environment shows which digits were right
(``"4?3>"``) and the model tries once more. ``build_policy`` is the reverse-digits demo's
warmed policy with a chat template that renders a user turn as its bare text, so the first
prompt is exactly what the warm start saw. The rewards are the reverse-digits demo's, on the
last answer, plus the environment's -0.25 for needing the second attempt.
"""

from streamrl.examples.multiturn.env import SecondAttempt, build_policy, hint

__all__ = ["SecondAttempt", "build_policy", "hint"]
