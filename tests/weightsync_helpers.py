"""Test helpers: start and watch real weightsync subscriber/publisher processes."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

SCRIPT = Path(__file__).with_name("weightsync_procs.py")


class Proc:
    """A weightsync_procs.py process whose JSON lines are collected by a reader thread."""

    def __init__(self, role: str, cfg, **opts):
        args = [
            sys.executable,
            str(SCRIPT),
            role,
            "--redis",
            cfg.broker.redis_url,
            "--run",
            cfg.run.name,
        ]
        args += ["--weightsync", cfg.weightsync.model_dump_json()]
        for key, value in opts.items():
            args += [f"--{key}", str(value)]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        self.popen = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, env=env)
        self.events: queue.Queue = queue.Queue()
        self.applied: list[dict] = []
        self.done: dict | None = None
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.popen.stdout:
            event = json.loads(line)
            if event["event"] == "applied":
                self.applied.append(event)
            if event["event"] == "done":
                self.done = event
            self.events.put(event)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def wait_event(self, kind: str, timeout: float = 30.0, **match) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            try:
                event = self.events.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"no {kind} event {match} within {timeout}s") from None
            if event["event"] == kind and all(event.get(k) == v for k, v in match.items()):
                return event

    def wait_exit(self, timeout: float = 30.0) -> int:
        return self.popen.wait(timeout=timeout)

    def signal(self, signum: int) -> None:
        os.kill(self.popen.pid, signum)

    def stop(self) -> None:
        if self.popen.poll() is None:
            os.kill(self.popen.pid, signal.SIGCONT)
            self.popen.kill()
            self.popen.wait(timeout=10)


class InProcessActor:
    """A subscriber in the test process with an engine loop in a thread: take_staged -> check -> applied."""

    def __init__(self, cfg, actor_id: str, hidden: int, layers: int):
        from weightsync_procs import check, engine_template

        from streamrl.weightsync.feed import WeightFeed

        self.template = engine_template(hidden, layers)
        # as an actor gets it: the feed picks the source from the config and run.host_id
        feed = WeightFeed.from_config(cfg.weightsync, cfg.broker, cfg.run, actor_id)
        self.sub = feed.subscriber(self.template).start()
        self.applied: list[tuple[int, bool]] = []
        self._check = lambda v, t: check(v, t, hidden, layers)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            staged = self.sub.take_staged()
            if staged is None:
                time.sleep(0.002)
                continue
            version, tensors = staged
            ok = self._check(version, tensors)
            for name, tensor in tensors.items():
                self.template[name].copy_(tensor)
            self.sub.applied(version)
            self.applied.append((version, ok))

    def wait_version(self, version: int, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while self.sub.version < version:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"in-process actor at version {self.sub.version}, wanted {version}"
                )
            time.sleep(0.01)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sub.close()


def wait_staged(sub, timeout_s: float, poll_s: float = 0.02) -> bool:
    """Poll up to ``timeout_s`` until ``sub`` holds a version ready for ``take_staged``."""
    deadline = time.monotonic() + timeout_s
    while sub.staged_version is None:
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)
    return True


def with_weightsync(cfg, **ws):
    """``cfg`` with a weightsync section validated from ``ws`` (a transport's own settings nested:
    ``dist={"backend": "gloo"}``), as a config file would give it."""
    from streamrl.configs.schema import WeightSyncConfig

    return cfg.model_copy(update={"weightsync": WeightSyncConfig.model_validate(ws)})
