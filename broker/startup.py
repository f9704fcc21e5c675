"""Where a process's start-up time goes: ``Phases`` times named stretches from the process's own
start (interpreter and imports included) and logs them as one line that ``bench.startup`` reads.

Once started, a process pins itself to the CPU cores its supervisor assigned (``pin_assigned``;
``learner.cpus``, ``actor.cpus``): after start-up, not before, so that the start-up of the
learner and the actors spreads over every core."""

from __future__ import annotations

import json
import logging
import os
import time

import psutil

# the log line's marker: "<who> startup {json}"
MARKER = "startup"


class Phases:
    """Durations of consecutive phases; the first starts at the process's creation."""

    def __init__(self) -> None:
        self.process_start = psutil.Process().create_time()
        self.last = time.time()
        # up to now: interpreter start, imports, config
        self.seconds = {"imports": self.last - self.process_start}

    def done(self, name: str) -> None:
        now = time.time()
        self.seconds[name] = now - self.last
        self.last = now

    def log(self, logger: logging.Logger, who: str) -> None:
        times = psutil.Process().cpu_times()
        record = {
            "process_start": self.process_start,
            "ready": self.last,
            # CPU seconds until ready: on a shared machine the wall times stretch, these do not
            "cpu_s": round(times.user + times.system, 3),
            "seconds": {k: round(v, 3) for k, v in self.seconds.items()},
        }
        logger.info("%s %s %s", who, MARKER, json.dumps(record))


# the cores a supervised process pins itself to once started, "0,1" (launch.placement.cpu_sets)
CPUS_ENV = "STREAMRL_CPUS"


def pin_process(pid: int, cpus: set[int]) -> None:
    """Restrict every thread of process ``pid`` to ``cpus`` (a process's affinity is per thread on
    Linux: the threads already running keep theirs); threads and processes it starts later
    inherit it."""
    try:
        threads = psutil.Process(pid).threads()
    except psutil.NoSuchProcess:
        return
    for thread in threads:
        try:
            os.sched_setaffinity(thread.id, cpus)
        except ProcessLookupError:
            pass


def pin(cpus: set[int]) -> None:
    """``pin_process`` this process and its descendants (an actor's reward workers)."""
    for proc in [psutil.Process(), *psutil.Process().children(recursive=True)]:
        pin_process(proc.pid, cpus)


def pin_assigned(logger: logging.Logger, who: str) -> None:
    """``pin`` to the cores in ``STREAMRL_CPUS``, if the supervisor set it."""
    raw = os.environ.get(CPUS_ENV)
    if not raw:
        return
    if not hasattr(os, "sched_setaffinity"):
        logger.warning(
            "%s: %s=%s is ignored: this platform has no CPU affinity", who, CPUS_ENV, raw
        )
        return
    pin({int(c) for c in raw.split(",")})
    logger.info("%s pinned to CPU core(s) %s", who, raw)
