"""Where a process hangs, on request: its threads' stacks written to its stderr (its log).

A supervisor that gives up on a child ignoring SIGTERM sends ``STACKS_SIGNAL`` before it kills the
child, so the log says where it was stuck rather than only that it was. faulthandler writes from
the signal handler itself, so a thread blocked in C (a socket read, a lock) is shown too.
"""

from __future__ import annotations

import faulthandler
import signal

STACKS_SIGNAL = signal.SIGUSR1


def dump_stacks_on_request() -> None:
    """From now on, ``STACKS_SIGNAL`` writes every thread's stack to stderr; the process goes on."""
    faulthandler.register(STACKS_SIGNAL, all_threads=True, chain=False)
