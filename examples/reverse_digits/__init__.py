"""The CPU demo task, "reverse 3 digits": prompt ``"314>"``, answer ``"413"`` then end-of-sequence.

Everything the demo needs that no model hub can give us here: ``build_policy`` (a char
tokenizer and a random-init tiny Qwen2 with a format warm start) and ``write_dataset`` (the
generated prompts), the inputs of ``configs/demo_cpu.yaml``; those of ``configs/sft_cpu.yaml``
(``build_initial_policy``, the random init; ``write_warm_start_dataset``, the warm start's
rows) and of ``configs/dpo_cpu.yaml`` (``write_preference_dataset``); and the rewards
``reverse_digits`` (shaped, what is trained) and ``reverse_digits_exact`` (the exact-match
rate, a target bar). ``streamrl example demo`` (``sft``, ``dpo``) makes a preset's inputs.
"""

from streamrl.examples.reverse_digits.assets import (
    build_initial_policy,
    build_policy,
    write_dataset,
    write_preference_dataset,
    write_warm_start_dataset,
)
from streamrl.examples.reverse_digits.rewards import reverse_digits, reverse_digits_exact

__all__ = [
    "build_initial_policy",
    "build_policy",
    "reverse_digits",
    "reverse_digits_exact",
    "write_dataset",
    "write_preference_dataset",
    "write_warm_start_dataset",
]
