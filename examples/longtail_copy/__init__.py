"""The long-tail task: copy a digit string whose length is heavy-tailed (``"40712>"`` -> ``"40712"``).

Lengths 1-24 with P(n) proportional to n^-1.5: half the prompts have one or two digits,
a few have twenty or more, so the longest completion of a batch is many times the
median, as with reasoning traces. A synchronous loop waits for that longest completion
every batch; streamrl's actors refill a finished slot with the next request. Used by
``configs/longtail_cpu.yaml`` and by ``bench.longtail``. It runs on the demo's char
tokenizer and tiny Qwen2 (``streamrl.examples.reverse_digits``), whose 64 positions hold
the longest prompt and completion. ``streamrl example longtail`` makes the policy and
dataset.
"""

from streamrl.examples.longtail_copy.assets import build_policy, write_dataset
from streamrl.examples.longtail_copy.rewards import copy_digits, copy_digits_exact

__all__ = ["build_policy", "copy_digits", "copy_digits_exact", "write_dataset"]
