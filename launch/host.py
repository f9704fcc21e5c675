"""``streamrl actors``: N supervised actors on this host, joining a run whose broker is elsewhere.

    streamrl actors --join redis://learner-host:6379/0 --count 4 --config gpu [key=value ...]

The actor side of a run on several hosts. It is ``launch.supervisor`` with the learner and Redis
left out: the same restart backoff, the same ``actor.gpus`` placement per actor, the same scale
command (``streamrl scale --host H``), plus the host's weight relay when the transport wants one
(``weightsync.relay.wanted``), started before the actors and stopped after them. What it keeps
is keyed by ``run.host_id``, since hosts may share ``run.dir``: its config, logs and placement
live in ``<run.dir>/hosts/<host_id>/``, its actors are ``<host_id>-a0``, ``<host_id>-a1``, ...,
and its scale commands arrive on a list of its own, signed with
the key it keeps there (``launch.control``: a host is scaled only by who can read that key). The password comes from
``STREAMRL_REDIS_PASSWORD`` or ``broker.password_file``, never the URL on the command line.
Without ``--join`` the actors find Redis as any process of the run does (``REDIS_URL``,
``broker.redis_url``, the run directory's ``redis.url``).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from pathlib import Path

import redis

from streamrl.broker.client import connect_sync, redis_url, tls_url
from streamrl.broker.password import add_join_argument, join_url
from streamrl.configs import Config, StreamRLError, config_from_cli, write_config
from streamrl.configs.runfiles import check_run_dir, enter_run_dir
from streamrl.launch import control, placement
from streamrl.launch.supervisor import CONFIG_FILE, Child, Supervisor

TICK_S = 0.5
JOIN_TIMEOUT_S = 10.0


def host_dir(run_dir: str, host_id: str) -> Path:
    """What one host's supervisor keeps: ``<run.dir>/hosts/<host_id>``."""
    return Path(run_dir) / "hosts" / host_id


def run_dirs(host_id: str) -> tuple[str, ...]:
    """The directories a host's supervisor writes below ``run.dir``: its state and its logs."""
    return (f"hosts/{host_id}/logs",)


class HostSupervisor(Supervisor):
    """``HostSupervisor(cfg, actors=4, url=...).start()``; ``tick()`` periodically; ``stop()``."""

    def __init__(self, cfg: Config, actors: int, url: str, python: str = sys.executable):
        super().__init__(cfg, actors=actors, python=python)
        self.redis_url = url
        self.host_id = cfg.run.host_id
        self.state_dir = host_dir(cfg.run.dir, self.host_id)
        self.log_dir = self.state_dir / "logs"
        self.config_file = self.state_dir / CONFIG_FILE
        self.actor_prefix = f"{self.host_id}-"
        self.control_key = control.control_key(self.keys.launch_control, self.host_id)

    def start(self) -> HostSupervisor:
        self.started_at = time.monotonic()
        # a wrong URL or password fails at once (the run's clients retry, a wrong password too),
        # before the inputs are loaded
        broker = self.cfg.broker.model_copy(update={"redis_url": self.redis_url})
        url, tls = tls_url(self.redis_url, broker)
        with redis.Redis.from_url(url, socket_connect_timeout=JOIN_TIMEOUT_S, **tls) as probe:
            probe.ping()
        self.redis = connect_sync(broker, self.cfg.run.dir)
        self._prepare_inputs()
        placement.check_launcher(self.cfg, self.launcher_devices, learner_here=False)
        # no learner here: actor.cpus alone ("auto" has no learner's cores to keep clear of)
        self.cpu_sets = placement.CpuSets(
            None,
            placement.cpu_sets(self.cfg, self.all_cpus, gpu_host=True).actors
            if isinstance(self.cfg.actor.cpus, list)
            else None,
        )
        # before the first file: the children inherit its umask (configs.runfiles)
        enter_run_dir(self.run_dir, self.cfg.run.shared_read, dirs=run_dirs(self.host_id))
        self._dir_ready = True
        self.scale_key = control.create_key(self.state_dir)
        write_config(self.cfg, self.config_file)
        self.event(f"host {self.host_id}: joined run {self.cfg.run.name!r}")
        self._start_relay()
        first = min(self.want_actors, 1) if self.cfg.actor.staggered_start else self.want_actors
        self._unstarted = self.want_actors - first
        for _ in range(first):
            self._add_actor()
        return self

    def _start_relay(self) -> None:
        from streamrl.weightsync import relay

        if not relay.wanted(self.cfg.weightsync):
            return
        argv = self._argv("streamrl.weightsync.relay", "--host-id", self.host_id)
        child = Child("relay", "relay", argv, self.log_dir / "relay.log")
        self.helpers.append(self._spawn(child))
        self.event(f"weight relay started (pid {child.proc.pid})")

    def _remove_shared_memory(self) -> None:
        """The learner's segments are the learner host's (``/dev/shm`` may be shared with it); the
        relay unlinks its own when stopped."""


def _parse(argv: list[str] | None) -> tuple[argparse.Namespace, Config]:
    parser = argparse.ArgumentParser(prog="streamrl actors", description=__doc__.splitlines()[0])
    add_join_argument(parser)
    parser.add_argument("--count", type=int, default=1, help="actor processes to start here")
    return config_from_cli(parser, argv)


def main(argv: list[str] | None = None) -> int:
    args, cfg = _parse(argv)
    if not 0 <= args.count <= cfg.actor.max_actors:
        print(
            f"streamrl actors: --count must be between 0 and actor.max_actors={cfg.actor.max_actors}",
            file=sys.stderr,
        )
        return 2
    try:
        url = join_url(args.join, cfg.broker) if args.join else None
        # the run-directory policy (configs.runfiles) before its URL file is read, the broker
        # reached or an input loaded; start() applies it whole once the broker answered
        check_run_dir(cfg.run.dir, dirs=run_dirs(cfg.run.host_id))
        sup = HostSupervisor(cfg, args.count, url or redis_url(cfg.broker, cfg.run.dir))
    except StreamRLError as exc:
        print(f"streamrl actors: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        sup.start()
        for line in sup.events:
            print(line, flush=True)
        shown = len(sup.events)
        while not stop.wait(TICK_S):
            sup.tick()
            for line in sup.events[shown:]:
                print(line, flush=True)
            shown = len(sup.events)
    except (StreamRLError, FileNotFoundError) as exc:
        print(f"streamrl actors: {exc}", file=sys.stderr)
        return 2
    except redis.RedisError as exc:
        print(f"streamrl actors: cannot reach the run's broker: {exc}", file=sys.stderr)
        return 1
    finally:
        sup.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
