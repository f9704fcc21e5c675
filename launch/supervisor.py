"""Start, watch and stop the processes of one run: Redis, the learner, N actors.

A small supervisor instead of supervisord: it has to know things no generic
tool knows (the learner resumes from its checkpoint, a clean exit of the
learner ends the run, actors are scaled from Redis commands, shutdown goes
actors -> learner -> Redis), and it is ~200 lines.

Policy: a child that exits 0 is done (intentional stop); one that exits with
``FATAL_EXIT`` stopped on purpose over something a restart cannot fix (a reward
failing on most samples) and ends the run; any other exit is a crash and the child
is restarted after an exponential backoff (1 s doubling to 30 s, reset once it has
stayed up for a minute). A learner that crashes ``learner.max_crashes`` times within
``learner.crash_window_s`` ends the run with its last traceback instead of looping.
What the run does with an existing ``run.dir`` is ``launch.rundir``'s: it resumes
from a checkpoint and deletes nothing it did not write. Children run in their own
session, so a terminal Ctrl-C reaches only the supervisor, which then stops
them in order; they also get SIGTERM if the supervisor itself dies
(PR_SET_PDEATHSIG), so nothing is orphaned.
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from streamrl.broker.client import connect_sync, url_file
from streamrl.broker.keys import Keys
from streamrl.broker.password import with_password
from streamrl.broker.server import EmbeddedRedis, RedisServerError
from streamrl.configs import Config, write_config
from streamrl.configs.redact import SECRETS_ENV, redact_text, secrets_env
from streamrl.configs.runfiles import check_run_dir, open_append, write_new
from streamrl.launch import control, placement, rundir
from streamrl.learner.outcome import FATAL_EXIT, FATAL_MARK
from streamrl.runtime import stacks
from streamrl.runtime.cpu_pinning import CPUS_ENV, pin_process

BACKOFF_START_S = 1.0
BACKOFF_MAX_S = 30.0
HEALTHY_AFTER_S = 60.0
STOP_TIMEOUT_S = {"actor": 15.0, "learner": 90.0, "relay": 15.0}
# the roles whose process writes its stacks on runtime.stacks.STACKS_SIGNAL (to anything else the
# signal is fatal), and how long they are given to
STACKS_ON_REQUEST = frozenset({"actor"})
STACKS_WAIT_S = 5.0
# the resolved config, saved with the run and loaded by every child (secrets redacted: the
# children get the Redis URL through REDIS_URL; configs.redact); mode 0600
CONFIG_FILE = "config.yaml"
# the rendezvous variables a learner of one must not inherit (see Supervisor._env)
DIST_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _child_setup(cpus: set[int]) -> None:
    _die_with_parent()
    # the start-up's cores, whichever cores this launcher runs on now (Supervisor._startup_cpus)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)


@dataclass
class Child:
    name: str
    # "learner" | "actor" | "relay"
    role: str
    argv: list[str]
    log: Path
    proc: subprocess.Popen | None = None
    crashes: int = 0
    restarts: int = 0
    next_start: float = 0.0
    started_at: float = 0.0
    exit_codes: list[int] = field(default_factory=list)
    # monotonic times of its crashes, for the crash-loop limit
    crash_times: list[float] = field(default_factory=list)
    # exited 0 or was stopped on purpose: never restarted
    done: bool = False
    # its CUDA_VISIBLE_DEVICES (launch.placement); None = inherited
    devices: str | None = None
    # the cores it pins itself to once started (launch.placement.cpu_sets); None = not pinned
    cpus: tuple[int, ...] | None = None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class Supervisor:
    """``Supervisor(cfg, actors=2).start()``; call ``tick()`` periodically; ``stop()``.

    ``overwrite`` starts over in a ``run.dir`` that holds an earlier run (removing only what
    streamrl wrote there); ``resume`` insists on a checkpoint to continue from. Without either,
    a checkpoint there is resumed (``launch.rundir``)."""

    def __init__(
        self,
        cfg: Config,
        actors: int = 2,
        resume: bool = False,
        python: str = sys.executable,
        overwrite: bool = False,
    ):
        self.cfg = cfg
        self.want_actors = actors
        self.resume = resume
        self.overwrite = overwrite
        self.python = python
        self.run_dir = Path(cfg.run.dir)
        self.log_dir = self.run_dir / "logs"
        self.config_file = self.run_dir / CONFIG_FILE
        self.keys = Keys.from_config(cfg.run, cfg.broker)
        self.redis_server: EmbeddedRedis | None = None
        self.redis_url: str | None = None
        self.redis = None
        self.learner: Child | None = None
        # started before the actors, stopped after them (an actor host's weight relay)
        self.helpers: list[Child] = []
        self.actors: list[Child] = []
        self.retired: list[Child] = []
        self._next_actor = 0
        # actor ids are f"{actor_prefix}a{i}": unique across the hosts of a run (launch.host)
        self.actor_prefix = ""
        # where placement.json goes, and the Redis list scale commands arrive on
        self.state_dir = self.run_dir
        self.control_key = self.keys.launch_control
        # the key a scale command must be signed with (launch.control); drawn at start
        self.scale_key: bytes | None = None
        # the stamp of the last scale command applied: an older or replayed one is dropped
        self._control_at = 0
        self.started_at = 0.0
        self.events: list[str] = []
        # how many of the events are in logs/supervisor.log, which is written to only once this
        # run has decided what to do with run.dir (launch.rundir)
        self._logged = 0
        self._dir_ready = False
        self._redis_next_start = 0.0
        self.launcher_devices = placement.launcher_devices()
        # child name -> its CUDA_VISIBLE_DEVICES (None = inherited), also in <run.dir>/placement.json
        self.placement: dict[str, str | None] = {}
        # the cores each role pins itself to once started (learner.cpus, actor.cpus)
        self.cpu_sets = placement.CpuSets(None, None)
        self.all_cpus = placement.launcher_cpus()
        # start() moved this process off the learner's cores; stop() moves it back
        self._pinned_self = False
        # actors still to start one by one (actor.staggered_start)
        self._unstarted = 0
        # in start(), spawning the first wave (_startup_cpus)
        self._starting = False
        # why the run must end now (a learner crash loop, a fatal learner exit); None while it runs
        self.failure: str | None = None

    # ----- start -------------------------------------------------------------------------
    @property
    def run_dirs(self) -> tuple[str, ...]:
        """The directories it writes below ``run.dir`` (never through a link: configs.runfiles):
        the logs, the scrape config ``launch.run`` writes, the embedded Redis's files."""
        return ("logs", "prometheus") + (() if self.cfg.broker.redis_url else ("redis",))

    def start(self) -> Supervisor:
        self.started_at = time.monotonic()
        # the run-directory policy (configs.runfiles) before the inputs cost anything; it reads
        # nothing there, and prepare checks again when it decides
        check_run_dir(self.run_dir, dirs=self.run_dirs)
        # everything that can be checked is, before run.dir is touched: a failing start leaves
        # an earlier run there as it was
        self._prepare_inputs()
        placement.check_launcher(self.cfg, self.launcher_devices)
        self.cpu_sets = placement.cpu_sets(
            self.cfg, self.all_cpus, placement.nvidia_present(self.launcher_devices)
        )
        # its umask is set before the first file: the children, Redis included, inherit it
        said = rundir.prepare(
            self.run_dir,
            overwrite=self.overwrite,
            resume=self.resume,
            shared_read=self.cfg.run.shared_read,
            dirs=self.run_dirs,
        )
        self._dir_ready = True
        self.event(said)
        self.scale_key = control.create_key(self.state_dir)
        # Children load this file, not the launcher's argv: a config made in Python has no file
        # of its own, and argv would show a password given as an override to every local user.
        write_config(self.cfg, self.config_file)
        self._start_redis()
        self.redis = connect_sync(self.cfg.broker, self.run_dir)
        self._write_run_file()
        if self.cpu_sets != placement.CpuSets(None, None):
            self.event(f"CPU cores once started: {self.cpu_sets.describe()}")
        self._starting = True
        learner = Child("learner", "learner", self._learner_argv(), self.log_dir / "learner.log")
        learner.cpus = self.cpu_sets.learner
        self.learner = self._spawn(self._place(learner, self.cfg.learner.gpus))
        first = min(self.want_actors, 1) if self.cfg.actor.staggered_start else self.want_actors
        # actor.staggered_start: the others start one by one (_start_next_actor)
        self._unstarted = self.want_actors - first
        for _ in range(first):
            self._add_actor()
        self._starting = False
        if self.cpu_sets.learner is not None and self.cpu_sets.actors is not None:
            # Redis and this launcher wake up at every group: off the learner's cores, where
            # each wake-up would preempt a step and evict its caches
            others = set(self.cpu_sets.actors)
            if self.redis_server is not None:
                pin_process(self.redis_server.proc.pid, others)
            pin_process(os.getpid(), others)
            self._pinned_self = True
        return self

    def _prepare_inputs(self) -> None:
        """Check the inputs before any child starts."""
        from streamrl.actors import engines, environment, inputs, rewards
        from streamrl.launch.dataset_check import check_dataset
        from streamrl.learner import tracking

        # else an actor whose engine is not installed would crash-loop under the backoff while the
        # others train (the children run this interpreter unless the launcher was given another)
        if self.python == sys.executable:
            for name in sorted(self.cfg.actor.engines_in_use):
                engines.get(name).check_installed()
        tracking.check_installed(self.cfg.run)
        inputs.check(self.cfg.model, self.cfg.data)
        rewards.check(self.cfg.reward)
        environment.check(self.cfg.env)
        # the dataset loaded as an actor loads it, unless these inputs passed before
        check_dataset(self.cfg)

    def _start_redis(self) -> None:
        if self.cfg.broker.redis_url:
            self.redis_url = self.cfg.broker.redis_url
            return
        # the password from where every role takes it (broker.password), else a random one
        self.redis_server = EmbeddedRedis(
            with_password(self.cfg.broker), self.run_dir / "redis", url_file=url_file(self.run_dir)
        ).start()
        self.redis_url = self.redis_server.url
        self.event(f"redis-server on {self.redis_server.broker.host}:{self.redis_server.port}")

    def _write_run_file(self) -> None:
        info = {
            "run": self.cfg.run.name,
            "supervisor_pid": os.getpid(),
            "config": str(self.config_file),
            # the launch, where a plot's wall-time axis starts (launch.plot)
            "started": time.time(),
        }
        write_new(self.run_dir / "run.json", json.dumps(info, indent=2) + "\n")

    def _argv(self, module: str, *extra: str) -> list[str]:
        # run.host_id is not saved with the config (configs.schema): a child would take its default
        host = f"run.host_id={self.cfg.run.host_id}"
        return [self.python, "-m", module, "--config", str(self.config_file), *extra, host]

    def _learner_argv(self) -> list[str]:
        # with learner.ranks > 1 it becomes torchrun --standalone --max-restarts 0 (learner.nodes):
        # a dead rank ends the job, the supervisor restarts it
        return self._argv("streamrl.learner")

    def _place(self, child: Child, gpus: list[int] | None) -> Child:
        if gpus is not None:
            child.devices = placement.visible_devices(gpus, self.launcher_devices)
        self.placement[child.name] = child.devices
        placement.write(self.state_dir, self.placement)
        return child

    def _env(self, child: Child) -> dict[str, str]:
        # A rendezvous inherited from the launching shell (a torchrun/SLURM job, or a process that
        # already ran a learner in-process) would make a learner of one join it through a TCP
        # store on every interface; torchrun sets these itself for learner.ranks > 1.
        env = {k: v for k, v in os.environ.items() if k not in DIST_ENV}
        env["REDIS_URL"] = self.redis_url or ""
        # what the saved config lacks (configs.redact): a judge's API key, a URL's password
        env[SECRETS_ENV] = secrets_env(self.cfg)
        env.setdefault("OMP_NUM_THREADS", str(self.cfg.run.torch_threads))
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        env["PYTHONUNBUFFERED"] = "1"
        if child.devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = child.devices
        env.pop(CPUS_ENV, None)
        if child.cpus is not None:
            env[CPUS_ENV] = ",".join(map(str, child.cpus))
        return env

    def _spawn(self, child: Child) -> Child:
        with open_append(child.log, binary=True) as log:
            child.proc = subprocess.Popen(
                child.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self._env(child),
                start_new_session=True,
                preexec_fn=functools.partial(_child_setup, self._startup_cpus(child)),
            )
        child.started_at = time.monotonic()
        return child

    def _startup_cpus(self, child: Child) -> set[int]:
        """Where a child starts: the learner and the actors started with it on every core, so that
        the first step comes soon; an actor started later (staggered, restarted, scaled up) on its
        own cores, off the cores of the learner it would otherwise slow down."""
        if child.role == "actor" and child.cpus is not None and not self._starting:
            return set(child.cpus)
        return set(self.all_cpus)

    def _add_actor(self) -> Child:
        index = self._next_actor
        ident = f"{self.actor_prefix}a{index}"
        self._next_actor += 1
        argv = self._argv("streamrl.actors", "--actor-id", ident)
        if self.cfg.actor.engines:
            # the one setting that differs between the actors of a run
            argv.append(f"actor.engine={self.cfg.actor.engine_of(index)}")
        child = Child(ident, "actor", argv, self.log_dir / f"actor-{ident}.log")
        child.cpus = self.cpu_sets.for_actor(self.cfg, index)
        child = self._spawn(self._place(child, placement.actor_gpus(self.cfg, index)))
        self.actors.append(child)
        self.event(f"actor {ident} started (pid {child.proc.pid})")
        return child

    # ----- watch -------------------------------------------------------------------------
    def tick(self) -> None:
        """Reap exits, restart crashed children after their backoff, apply scale commands."""
        now = time.monotonic()
        self._watch_redis(now)
        for child in [self.learner, *self.helpers, *self.actors]:
            if child is not None:
                self._watch(child, now)
        self._start_next_actor()
        self._apply_control()

    def _start_next_actor(self) -> None:
        """``actor.staggered_start``: one more actor once the newest has sent a heartbeat (or has
        exited: its restarts must not hold the others back)."""
        if self._unstarted <= 0 or self._redis_down:
            return
        newest = self.actors[-1]
        if newest.alive:
            try:
                if not self.redis.exists(self.keys.actor(newest.name)):
                    return
            # Redis restarting: the next tick asks again
            except Exception:
                return
        self._unstarted -= 1
        self._add_actor()

    def _watch_redis(self, now: float) -> None:
        """A dead embedded redis-server (SIGKILL, OOM killer) comes back at once on the same port,
        password and data dir: with AOF it replays everything it acknowledged, and the children's
        retries bridge the gap. Without persistence it comes back empty (docs/guarantees.md)."""
        server = self.redis_server
        if server is None or server.proc is None or now < self._redis_next_start:
            return
        code = server.proc.poll()
        if code is None:
            return
        try:
            server.restart()
        except RedisServerError as exc:
            self._redis_next_start = now + BACKOFF_START_S
            self.event(f"redis-server exited with {_describe(code)}; restart failed: {exc}")
            return
        self.event(f"redis-server exited with {_describe(code)}; restarted on port {server.port}")

    def _watch(self, child: Child, now: float) -> None:
        if child.done:
            return
        if child.proc is not None:
            code = child.proc.poll()
            if code is None:
                if now - child.started_at > HEALTHY_AFTER_S:
                    child.crashes = 0
                return
            child.exit_codes.append(code)
            _kill_group(child.proc.pid)
            child.proc = None
            if code == 0:
                child.done = True
                self.event(f"{child.name} exited cleanly")
                return
            if code == FATAL_EXIT:
                child.done = True
                self.failure = last_error(child.log, FATAL_MARK)
                self.event(f"{child.name} stopped the run (log: {child.log})")
                return
            child.crash_times.append(now)
            if child.role == "learner" and self._crash_loop(child, now):
                return
            child.crashes += 1
            delay = min(BACKOFF_MAX_S, BACKOFF_START_S * 2 ** (child.crashes - 1))
            child.next_start = now + delay
            self.event(
                f"{child.name} exited with {_describe(code)}; restarting in {delay:.0f} s (log: {child.log})"
            )
            return
        if now >= child.next_start:
            self._spawn(child)
            child.restarts += 1
            self.event(f"{child.name} restarted (pid {child.proc.pid}, restart {child.restarts})")

    def _crash_loop(self, child: Child, now: float) -> bool:
        """Past ``learner.max_crashes`` crashes within ``learner.crash_window_s``, the learner
        stays down and the run fails with its last traceback: a restart would crash again."""
        window = self.cfg.learner.crash_window_s
        recent = child.crash_times = [t for t in child.crash_times if now - t <= window]
        if len(recent) < self.cfg.learner.max_crashes:
            return False
        child.done = True
        self.failure = (
            f"the learner crashed {len(recent)} times within {window:.0f} s "
            f"(learner.max_crashes={self.cfg.learner.max_crashes}); its last error:\n"
            f"{last_error(child.log)}"
        )
        self.event(f"learner crash loop: {len(recent)} crashes in {window:.0f} s; not restarted")
        return True

    @property
    def _redis_down(self) -> bool:
        """The embedded server is down: a call's retries would hold the tick, and with it the
        server's restart, for as long as the children's own retries last."""
        server = self.redis_server
        return server is not None and (server.proc is None or server.proc.poll() is not None)

    def _apply_control(self) -> None:
        """``streamrl scale`` pushes a signed count onto this supervisor's list (launch.control);
        an entry that is not one is logged and dropped."""
        if self._redis_down or self.scale_key is None:
            return
        try:
            raw = self.redis.lpop(self.control_key)
        # Redis restarting: scaling waits, supervision does not
        except Exception as exc:
            self.event(f"control channel unavailable: {type(exc).__name__}")
            return
        if raw is None:
            return
        try:
            command = control.decode(
                raw, self.scale_key, self.control_key, self.cfg.actor.max_actors
            )
            if command.at <= self._control_at:
                raise control.BadCommand("not newer than the last one applied (a replay)")
        except control.BadCommand as exc:
            self.event(f"dropped scale command {control.preview(raw)}: {exc}")
            return
        self._control_at = command.at
        self.scale(command.actors)

    def scale(self, wanted: int) -> None:
        # never past the config bound, whoever asks
        if wanted > self.cfg.actor.max_actors:
            self.event(
                f"scale to {wanted} actors clamped to actor.max_actors={self.cfg.actor.max_actors}"
            )
        wanted = min(max(0, wanted), self.cfg.actor.max_actors)
        self.want_actors = wanted
        # a scale command starts what it asks for at once
        self._unstarted = 0
        running = [a for a in self.actors if not a.done]
        for _ in range(wanted - len(running)):
            self._add_actor()
        for child in running[wanted:]:
            self._stop_child(child)
            self.actors.remove(child)
            self.retired.append(child)
            self.placement.pop(child.name, None)
        placement.write(self.state_dir, self.placement)
        self.event(f"scaled to {wanted} actors")

    @property
    def learner_finished(self) -> bool:
        return self.learner is not None and self.learner.done

    def wait_until(
        self, predicate: Callable[[], bool], timeout: float, interval: float = 0.5
    ) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.tick()
            if predicate():
                return True
            time.sleep(interval)
        return False

    def event(self, text: str) -> None:
        """Shown in the live view, and kept in logs/supervisor.log once the run directory is
        ready (the events of the checks before it are written then)."""
        stamp = time.strftime("%H:%M:%S")
        # a path given as a URL may carry credentials
        self.events.append(f"{stamp} {redact_text(text)}")
        if not self._dir_ready:
            return
        with open_append(self.log_dir / "supervisor.log") as f:
            f.writelines(f"{line}\n" for line in self.events[self._logged :])
        self._logged = len(self.events)

    # ----- stop --------------------------------------------------------------------------
    def _stop_child(self, child: Child) -> None:
        stop_child(child, self.event, STOP_TIMEOUT_S[child.role])

    @property
    def started_anyone(self) -> bool:
        """Whether ``start`` got as far as a process of the run's (Redis, the learner, an actor)."""
        return any(x is not None for x in (self.redis_server, self.learner)) or bool(
            self.actors or self.helpers
        )

    def stop(self) -> None:
        """Actors first (they abandon their group), then the learner (final checkpoint), then Redis."""
        for child in self.actors:
            child.done = True
            if child.alive:
                child.proc.send_signal(signal.SIGTERM)
        for child in self.actors:
            self._stop_child(child)
        for child in self.helpers:
            self._stop_child(child)
        if self.learner is not None:
            self._stop_child(self.learner)
        if self.redis is not None:
            self.redis.close()
        if self.redis_server is not None:
            self.redis_server.stop()
        # a start refused before its learner (another run live in run.dir, a run.dir refused)
        # owns no segment: those of its run name may be a live run's
        if self.learner is not None:
            self._remove_shared_memory()
        if self._pinned_self:
            # a launcher in a notebook (streamrl.run) goes on where it ran before
            pin_process(os.getpid(), set(self.all_cpus))
            self._pinned_self = False
        self.event("stopped")

    def _remove_shared_memory(self) -> None:
        """A learner killed mid-publish cannot unlink its segments; the run's names are known."""
        from streamrl.weightsync.transports.shm.segment import cleanup_stale_segments

        removed = cleanup_stale_segments(self.cfg.run.name)
        if removed:
            self.event(f"removed {len(removed)} stale shared-memory segment(s)")


def last_error(log: Path, mark: str = "Traceback", max_lines: int = 40) -> str:
    """From the last line of a child's log that starts with ``mark`` (a traceback), else its
    last lines, for the terminal."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"(no log: {exc.strerror})"
    starts = [i for i, line in enumerate(lines) if line.startswith(mark)]
    shown = lines[starts[-1] :] if starts else lines
    return "\n".join(shown[-max_lines:])


def stop_child(child: Child, event: Callable[[str], None], timeout: float) -> None:
    """SIGTERM ``child`` and wait ``timeout`` seconds for it to exit; one that does not is asked for
    its threads' stacks (the roles in ``STACKS_ON_REQUEST``: into its log), then killed with its
    process group."""
    child.done = True
    if not child.alive:
        return
    child.proc.send_signal(signal.SIGTERM)
    try:
        child.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        said = f"{child.name} ignored SIGTERM for {timeout:.0f} s"
        if child.role in STACKS_ON_REQUEST:
            child.proc.send_signal(stacks.STACKS_SIGNAL)
            try:
                # faulthandler writes from its signal handler, as soon as the child is scheduled
                child.proc.wait(STACKS_WAIT_S)
            except subprocess.TimeoutExpired:
                pass
            said += f" (its threads' stacks: {child.log})"
        event(f"{said}; killing its process group")
        _kill_group(child.proc.pid)
        child.proc.wait(10)
    _kill_group(child.proc.pid)
    child.exit_codes.append(child.proc.returncode)


def _kill_group(pgid: int) -> None:
    """SIGKILL what is left of a child's process group once the child itself has exited (or ignored
    SIGTERM): reward workers and multiprocessing's resource tracker of a crashed actor would
    otherwise outlive it. Each child leads its own session, so its pid is the group id."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"code {code}"
