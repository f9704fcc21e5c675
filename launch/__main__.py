"""`make run`: Redis + learner + N actors on one machine, a live view, a summary at the end.

python -m streamrl.launch --config configs/demo_cpu.yaml --actors 2 [dotted.key=value ...]
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import time

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from rich.console import Console
from rich.live import Live

from streamrl.actors.prompts import PromptDataError
from streamrl.broker.server import RedisServerError
from streamrl.configs import config_from_cli
from streamrl.launch.scrape import sync_targets, write_prometheus_config
from streamrl.launch.status import Snapshot, read_steps, snapshot
from streamrl.launch.supervisor import Supervisor
from streamrl.launch.view import live_table, plain_line, summary

REFRESH_S = 1.0
PLAIN_EVERY_S = 10.0


class _Stop(Exception):
    pass


def _raise_stop(signum, _frame):
    raise _Stop(signal.Signals(signum).name)


def refresh(cfg, redis_client, keys, run_dir, prom_dir) -> Snapshot | None:
    """The live view's snapshot, with the Prometheus targets brought up to date; None while Redis
    is unreachable: the supervisor's next tick restarts an embedded server that died, so the view
    skips a beat instead of ending the run."""
    try:
        snap = snapshot(redis_client, keys, run_dir, cfg.broker.consumer_group)
        sync_targets(cfg, redis_client, prom_dir)
    except (RedisConnectionError, RedisTimeoutError) as exc:
        print(f"live view: Redis unreachable ({exc}); retrying", file=sys.stderr, flush=True)
        return None
    return snap


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run broker + learner + actors with a live view.")
    parser.add_argument("--actors", type=int, default=2, help="actor processes to start")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="keep the run directory (learner resumes from its checkpoint)",
    )
    args, cfg = config_from_cli(parser, argv)

    console = Console()
    sup = Supervisor(cfg, args.config, args.overrides, actors=args.actors, resume=args.resume)
    signal.signal(signal.SIGTERM, _raise_stop)
    signal.signal(signal.SIGINT, _raise_stop)
    started = time.monotonic()
    started_unix = time.time()
    reason = "start failed"
    try:
        sup.start()
        prom_dir = sup.run_dir / "prometheus"
        write_prometheus_config(prom_dir)
        console.print(
            f"run directory {sup.run_dir} (logs in {sup.log_dir}); Ctrl-C stops everything"
        )
        last_plain = 0.0
        reason = "learner finished"
        with (
            Live(console=console, refresh_per_second=2, transient=False)
            if console.is_terminal
            else contextlib.nullcontext() as live
        ):
            while not sup.learner_finished:
                sup.tick()
                elapsed = time.monotonic() - started
                if cfg.run.max_time_s and elapsed > cfg.run.max_time_s + 30:
                    reason = "time limit"
                    break
                snap = refresh(cfg, sup.redis, sup.keys, sup.run_dir, prom_dir)
                if snap is None:
                    time.sleep(REFRESH_S)
                    continue
                if console.is_terminal:
                    live.update(live_table(snap, elapsed, sup.events))
                elif elapsed - last_plain >= PLAIN_EVERY_S:
                    last_plain = elapsed
                    print(plain_line(snap, elapsed), flush=True)
                time.sleep(REFRESH_S)
    except (PromptDataError, RedisServerError, FileNotFoundError) as exc:
        print(exc, file=sys.stderr)
        return 2
    except _Stop as stop:
        reason = f"{stop} received"
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        console.print(f"stopping ({reason}) ...")
        sup.stop()
    console.print(
        summary(
            read_steps(sup.run_dir),
            started_unix,
            time.monotonic() - started,
            sup.events,
            cfg.run,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
