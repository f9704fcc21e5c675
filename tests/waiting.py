"""Test helper: wait for a condition another thread or process brings about."""

from __future__ import annotations

import time


def until(predicate, timeout_s: float = 120.0, poll_s: float = 0.02) -> None:
    """Return once ``predicate()`` is true; TimeoutError after ``timeout_s`` (a hang, not a timing)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(poll_s)
