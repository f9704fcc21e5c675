"""Reward of the copy task: the completion should repeat the prompt's digits, then stop.

Per-sample form: ``(messages, answer, **columns)``. ``length`` is a column of the
dataset file; it reaches this function because the signature names it.
"""


def copy_digits(messages, answer, length):
    completion = messages[-1]
    text = completion["content"]
    right = sum(a == b for a, b in zip(text, answer, strict=False))
    stopped = completion.get("finish_reason") == "stop" and len(text) == length
    return {"digits": 0.9 * right / length, "stop": 0.1 * float(stopped)}


def exact_batch(prompts, completions, target, **_):
    """The same task in TRL's batched form: 1 for an exact copy (prompts are strings here)."""
    return [float(c.strip() == t) for c, t in zip(completions, target, strict=True)]
