"""The CPU cores a supervised process runs on: once started, it pins itself to the cores its
supervisor assigned (``pin_assigned``; ``learner.cpus``, ``actor.cpus``, chosen by
``launch.placement``): after start-up, not before, so that the start-up of the learner and the
actors spreads over every core."""

from __future__ import annotations

import logging
import os

import psutil

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
