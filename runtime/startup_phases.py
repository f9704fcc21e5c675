"""Where a process's start-up time goes: ``Phases`` times named stretches from the process's own
start (interpreter and imports included) and logs them as one line that ``bench.startup`` reads."""

from __future__ import annotations

import json
import logging
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
