"""Misbehaving reward plug-ins for the containment tests (imported by reward workers as module:function)."""

import time


def raises(messages, answer):
    raise RuntimeError("plug-in bug")


def returns_nan(messages, answer):
    return float("nan")


def returns_garbage(messages, answer):
    return "very good"


def hangs(messages, answer):
    time.sleep(3600)


def hogs_memory(messages, answer):
    blocks = []
    while True:
        blocks.append(bytearray(64 << 20))


def length_parts(messages, answer):
    return {"chars": len(messages[-1]["content"]) / 10, "bonus": 0.5}


def picky(messages, answer):
    if answer == "bad":
        raise RuntimeError("this sample breaks the plug-in")
    return 1.0


def hangs_on_hang(messages, answer):
    if answer == "hang":
        time.sleep(3600)
    return 1.0


def uses_column(messages, answer, difficulty):
    return float(difficulty)


def chunk_size(prompts, completions, answer, **columns):
    """TRL's batched form: every sample of the call scores the number of samples in the call."""
    assert len(prompts) == len(completions) == len(answer)
    assert all(len(values) == len(prompts) for values in columns.values())
    return [float(len(prompts))] * len(prompts)


def batched_raises(prompts, completions, **columns):
    raise RuntimeError("batched plug-in bug")


def trl_lengths(prompts, completions, completion_ids, level, **kwargs):
    """TRL's form, recognised by its signature (no ``batched: true``): each sample scores its
    completion's token count, read from completion_ids; the row's columns come as lists."""
    assert len(prompts) == len(completions) == len(completion_ids) == len(level)
    assert "answer" in kwargs
    return [float(len(ids)) for ids in completion_ids]


def takes_anything(*args, **kwargs):
    """No telling signature: per sample unless the spec forces ``batched: true``."""
    if args:
        return 2.0
    return [1.0] * len(kwargs["completions"])


def always_fails(messages, answer):
    raise KeyError("the column this reward needs is not in the dataset")
