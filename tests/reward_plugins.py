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
