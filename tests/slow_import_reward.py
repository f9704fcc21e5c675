"""A reward plug-in whose import takes longer than the pool's per-sample time limit."""

import time

time.sleep(2.5)


def one(messages, answer):
    return 1.0
