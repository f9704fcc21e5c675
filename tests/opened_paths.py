"""Which paths this process opens while a block runs (a Python audit hook sees every ``open`` and
``os.open``): how a test shows that a name it planted was never opened, not merely refused after."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

_recording: list[list[str]] = []
_installed = False


def _hook(event: str, args: tuple) -> None:
    if event == "open" and _recording and isinstance(args[0], str | bytes | os.PathLike):
        _recording[-1].append(os.fsdecode(args[0]))


@contextlib.contextmanager
def opened_paths() -> Iterator[list[str]]:
    """The paths opened inside the block (as given to ``open``, relative ones included)."""
    global _installed
    if not _installed:
        # an audit hook cannot be removed: one for the session, recording only inside a block
        sys.addaudithook(_hook)
        _installed = True
    seen: list[str] = []
    _recording.append(seen)
    try:
        yield seen
    finally:
        _recording.remove(seen)
