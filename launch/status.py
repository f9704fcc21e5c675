"""A snapshot of a running system, read from Redis and the learner's step records.

The live view and the end-of-run summary both read it; neither talks to a
process directly, so they work the same for actors started elsewhere.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from streamrl.broker.keys import Keys
from streamrl.broker.liveness import alive_actors
from streamrl.learner import target
from streamrl.runtime.jsonl_log import read_jsonl


@dataclass
class Snapshot:
    at: float
    version: int = 0
    stream_length: int = 0
    pending: int = 0
    dead_letters: int = 0
    actors: list[dict] = field(default_factory=list)
    last_step: dict | None = None

    @property
    def generate_tokens_per_s(self) -> float:
        return sum(float(a.get("tokens_per_s", 0.0)) for a in self.actors)

    @property
    def hosts(self) -> dict[str, list[dict]]:
        return by_host(self.actors)


def by_host(actors: list[dict]) -> dict[str, list[dict]]:
    """Live actors (``alive_actors``' heartbeats) grouped by the host each beats from, hosts sorted."""
    hosts: dict[str, list[dict]] = {}
    for actor in actors:
        hosts.setdefault(actor.get("host", "?"), []).append(actor)
    return dict(sorted(hosts.items()))


def describe_hosts(actors: list[dict]) -> str:
    """``A: A-a0@v7, A-a1@v7 · C: C-a0@v6`` (each actor's current weight version)."""
    return " · ".join(
        f"{host}: " + ", ".join(f"{a['id']}@v{a.get('version', '?')}" for a in group)
        for host, group in by_host(actors).items()
    )


def read_steps(run_dir: str | Path) -> list[dict]:
    """All step records the learner wrote (a partial last line from a crash is skipped)."""
    return read_jsonl(Path(run_dir) / "learner_steps.jsonl")


def snapshot(redis, keys: Keys, run_dir: str | Path, group: str) -> Snapshot:
    snap = Snapshot(at=time.time())
    snap.version = int(redis.get(keys.version) or 0)
    snap.stream_length = int(redis.xlen(keys.stream))
    snap.dead_letters = int(redis.xlen(keys.dead))
    try:
        snap.pending = int(redis.xpending(keys.stream, group)["pending"])
    # the group appears with the learner's first read
    except Exception:
        snap.pending = 0
    snap.actors = alive_actors(redis, keys)
    steps = read_steps(run_dir)
    snap.last_step = steps[-1] if steps else None
    return snap


def time_to_target(steps: list[dict], started_unix: float, goal: target.Target) -> float | None:
    """Seconds from ``started_unix`` until the steps first reach ``goal`` (the learner's own stop
    rule, ranges and all); None if they never do."""
    end = goal.reached_at(steps)
    return None if end is None else steps[end]["time"] - started_unix
