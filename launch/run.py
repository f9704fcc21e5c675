"""``streamrl.run(cfg)``: Redis + learner + N actors on one machine until the learner stops.

The one implementation behind ``streamrl run`` (``make run``) and the Python API: it starts the
supervisor, shows a live view (a progress bar and a table on a terminal, a line every few
learner steps elsewhere), stops everything in order, plots the run (``launch.plot``) and
returns what the run did.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from rich.console import Console, Group
from rich.live import Live

from streamrl.configs import Config
from streamrl.launch import plot
from streamrl.launch.placement import describe as describe_placement
from streamrl.launch.scrape import prometheus_dir, sync_targets, write_prometheus_config
from streamrl.launch.status import Snapshot, read_steps, snapshot
from streamrl.launch.supervisor import Supervisor
from streamrl.launch.view import (
    RunProgress,
    live_table,
    plain_due,
    plain_every,
    plain_line,
    summary,
)

REFRESH_S = 1.0
# past run.max_time_s, how long the learner gets to stop by itself before the launcher stops it
TIME_LIMIT_GRACE_S = 30.0


class StepRows:
    """The learner's step rows handed to ``on_step`` in this process as they appear, each once and
    in order; a resumed run's earlier rows are not handed again."""

    def __init__(self, run_dir: Path, on_step: Callable[[dict], None] | None) -> None:
        self.run_dir, self.on_step = run_dir, on_step
        self.seen = len(read_steps(run_dir)) if on_step is not None else 0

    def deliver(self) -> None:
        if self.on_step is None:
            return
        rows = read_steps(self.run_dir)
        for row in rows[self.seen :]:
            self.on_step(row)
        self.seen = len(rows)


@dataclass(frozen=True)
class RunSummary:
    """What a finished run did: learner steps, the last step's mean reward (None without a
    step), why it stopped, where its files are, its wall time, and what failed (None when the
    learner stopped by itself or was asked to)."""

    steps: int
    final_reward: float | None
    reason: str
    run_dir: Path
    elapsed_s: float
    failure: str | None = None


class _Stop(Exception):
    pass


def _raise_stop(signum, _frame):
    raise _Stop(signal.Signals(signum).name)


def _set_handlers(handler) -> dict | None:
    """Install ``handler`` for SIGTERM and SIGINT; returns the handlers it replaced, or None off
    the main thread, which cannot install any (the caller's own handling then stays)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}


def refresh(consumer_group: str, redis_client, keys, run_dir, prom_dir) -> Snapshot | None:
    """The live view's snapshot, with the Prometheus targets brought up to date; None while Redis
    is unreachable: the supervisor's next tick restarts an embedded server that died, so the view
    skips a beat instead of ending the run."""
    try:
        snap = snapshot(redis_client, keys, run_dir, consumer_group)
        sync_targets(keys, redis_client, prom_dir)
    except (RedisConnectionError, RedisTimeoutError) as exc:
        print(f"live view: Redis unreachable ({exc}); retrying", file=sys.stderr, flush=True)
        return None
    return snap


def _watch(
    sup: Supervisor,
    max_steps: int,
    max_time_s: float,
    consumer_group: str,
    console: Console,
    started: float,
    rows: StepRows,
) -> str:
    """Tick the supervisor and show the live view until the learner stops, or ``max_time_s``
    (0: no limit) is past by more than the grace; returns why it ended."""
    prom_dir = prometheus_dir(sup.run_dir)
    write_prometheus_config(prom_dir)
    console.print(f"run directory {sup.run_dir} (logs in {sup.log_dir}); Ctrl-C stops everything")
    if any(v is not None for v in sup.placement.values()):
        console.print(f"GPUs (CUDA_VISIBLE_DEVICES): {describe_placement(sup.placement)}")
    progress = RunProgress(max_steps, max_time_s)
    every, last_plain = plain_every(max_steps), None
    with (
        Live(console=console, refresh_per_second=2, transient=False)
        if console.is_terminal
        else contextlib.nullcontext() as live
    ):
        while not sup.learner_finished:
            sup.tick()
            if sup.failure:
                return "failed"
            elapsed = time.monotonic() - started
            if max_time_s and elapsed > max_time_s + TIME_LIMIT_GRACE_S:
                return "time limit"
            snap = refresh(consumer_group, sup.redis, sup.keys, sup.run_dir, prom_dir)
            if snap is None:
                time.sleep(REFRESH_S)
                continue
            rows.deliver()
            step = int((snap.last_step or {}).get("step", 0))
            progress.update(step, elapsed)
            if console.is_terminal:
                table = live_table(snap, elapsed, sup.events, sup.placement)
                live.update(Group(progress.bar, table))
            elif plain_due(step, last_plain, every):
                last_plain = step
                print(plain_line(snap, elapsed, progress), flush=True)
            time.sleep(REFRESH_S)
    return "learner finished"


def run(
    cfg: Config,
    actors: int = 2,
    resume: bool = False,
    overwrite: bool = False,
    on_step: Callable[[dict], None] | None = None,
) -> RunSummary:
    """Run ``cfg`` (from ``streamrl.load_config``) with ``actors`` actor processes until the
    learner stops (``run.max_steps``, ``run.max_time_s``, its target) or SIGINT/SIGTERM; prints
    the live view and the end-of-run summary. A checkpoint in ``run.dir`` is resumed;
    ``overwrite`` starts over instead, ``resume`` fails without one (``launch.rundir``).
    ``on_step(row)`` is called in this process with each learner step row as it appears (the
    row ``learner_steps.jsonl`` holds), the last ones once the learner has stopped.

    Raises a ``StreamRLError`` (a broken dataset, no vLLM for a vLLM actor, Redis that will not
    start, ...) before any child starts; the children are stopped whatever happens.
    """
    console = Console()
    sup = Supervisor(cfg, actors=actors, resume=resume, overwrite=overwrite)
    started = time.monotonic()
    started_unix = time.time()
    reason = "start failed"
    previous = _set_handlers(_raise_stop)
    rows = None
    try:
        sup.start()
        rows = StepRows(sup.run_dir, on_step)
        reason = _watch(
            sup,
            cfg.run.max_steps,
            cfg.run.max_time_s,
            cfg.broker.consumer_group,
            console,
            started,
            rows,
        )
    except _Stop as stop:
        reason = f"{stop} received"
    finally:
        # stopping the children in order is not cut short by a second Ctrl-C
        _set_handlers(signal.SIG_IGN)
        # a start refused before it started anyone (a missing input, a refused run.dir) is its
        # one line of error, nothing said about stopping
        if sup.started_anyone:
            console.print(f"stopping ({reason}) ...")
        sup.stop()
        for sig, handler in (previous or {}).items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
    elapsed = time.monotonic() - started
    if rows is not None:
        rows.deliver()
    steps = read_steps(sup.run_dir)
    plots = plot.at_end(sup.run_dir) if steps else None
    console.print(summary(steps, started_unix, elapsed, sup.events, cfg, plots))
    if sup.failure:
        print(f"run failed: {sup.failure}", file=sys.stderr, flush=True)
    last = steps[-1] if steps else {}
    return RunSummary(
        steps=int(last.get("step", 0)),
        final_reward=last.get("reward_mean"),
        reason=reason,
        run_dir=sup.run_dir,
        elapsed_s=elapsed,
        failure=sup.failure,
    )
