"""Chaos soak: the whole system under the `make run` supervisor, with faults injected at random points.

    python -m bench.chaos --rounds N --seed S        (make chaos ROUNDS=N)

Each round starts Redis (AOF persistence on or off, chosen by the seed), the
learner and two actors on the CPU demo config with small steps, then injects
faults in a seeded order at seeded moments, waiting after each until the
system recovered by itself:

- ``kill_actor``: SIGKILL one actor; recovered when the supervisor restarted it
  and it published again.
- ``kill_learner``: SIGKILL the learner; recovered at its next step record.
- ``stop_actor``: SIGSTOP one actor's process group for longer than
  ``weightsync.timeout_s``, then SIGCONT; the learner must keep stepping
  meanwhile; recovered when the actor published again.
- ``restart_redis``: ``EmbeddedRedis.restart()``; recovered at the next step.

Aimed faults watch the learner from outside (Redis state and its checkpoint
folder, polled every few milliseconds; no hook in the learner) and SIGKILL it
inside one window, then wait for its next step record (a kill that landed
after its window counts as a plain learner kill, and the fault aims again):

- ``kill_after_read``: its pending list grew (XREADGROUP delivered a batch)
  while ``adm:consumed`` did not: entries read, not yet counted.
- ``kill_in_save``: a checkpoint folder newer than the one ``latest`` names
  exists: a save (a same-step re-save included) is being written.
- ``kill_after_switch``: ``latest`` just changed: the checkpoint is complete,
  the entries it covers not yet acked (the detail says if the ack was logged).
- ``kill_redis``: SIGKILL the embedded redis-server; the supervisor restarts
  it on the same port and data dir (with AOF it loses nothing it acked; without,
  it is a wipe like ``restart_redis``); recovered at the next step.

At the end of the round everything is stopped cleanly (actors, then learner,
through the supervisor) and the invariants of ``bench.chaos_checks`` are
checked from the run's records and Redis; then the run's keys are deleted
(``broker.cleanup``) and the system shut down, after which no process of the
run, no shared-memory segment and no key may remain.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from bench import chaos_checks as checks
from streamrl.broker.cleanup import delete_run_keys, ephemeral_leftovers, run_keys
from streamrl.broker.wire import WireError, decode_group
from streamrl.configs import load_config
from streamrl.launch.status import read_steps
from streamrl.launch.supervisor import Supervisor
from streamrl.learner import checkpoint
from streamrl.runtime.jsonl_log import commits_path, published_path, read_jsonl
from streamrl.weightsync.transports.shm.segment import SHM_DIR, segment_prefix

CONFIG = "configs/demo_cpu.yaml"
FAULTS = ("kill_actor", "kill_learner", "stop_actor", "restart_redis")
AIMED = ("kill_after_read", "kill_in_save", "kill_after_switch", "kill_redis")
# how often an aimed fault looks at Redis or the checkpoint folder for its window
POLL_S = 0.003
# kills an aimed fault may spend on missing its window before that counts as a violation
AIM_TRIES = 3
SYNC_TIMEOUT_S = 3.0
STOP_FOR_S = 2.5 * SYNC_TIMEOUT_S
RECOVERY_TIMEOUT_S = 150.0
START_TIMEOUT_S = 240.0


def overrides(
    run_name: str, run_dir: Path, policy: str, dataset: str, appendonly: bool
) -> list[str]:
    """Small steps so a round sees many steps and checkpoints in a minute on 2 cores."""
    return [
        f"run.name={run_name}",
        f"run.dir={run_dir}",
        f"model.path={policy}",
        f"data.path={dataset}",
        "run.max_time_s=0",
        "run.max_steps=0",
        # a soak runs until it is stopped, not until the demo's target
        "run.target_reward=0",
        "run.target_parts.reverse_digits_exact=0",
        "rollout.group_size=8",
        "actor.batch_slots=16",
        "learner.groups_per_step=4",
        "learner.checkpoint_every=3",
        "actor.heartbeat_s=1",
        "broker.lease_ttl_s=20",
        "broker.claim_idle_ms=10000",
        f"broker.appendonly={str(appendonly).lower()}",
        f"weightsync.timeout_s={SYNC_TIMEOUT_S}",
        "actor.publish_log=true",
        "learner.commit_log=true",
        # a round kills the learner more often than a crash loop would crash it
        "learner.max_crashes=1000",
    ]


@dataclass
class Fault:
    kind: str
    # None: did not recover within RECOVERY_TIMEOUT_S
    recovery_s: float | None
    detail: str = ""


@dataclass
class RoundResult:
    index: int
    appendonly: bool
    faults: list[Fault] = field(default_factory=list)
    delivery: checks.Delivery | None = None
    steps: int = 0
    violations: list[str] = field(default_factory=list)
    seconds: float = 0.0
    shm_removed_by_supervisor: int = 0


class _Processes:
    """Every process of the run ever seen (pid + start time, so a reused pid is not blamed)."""

    def __init__(self):
        self.seen: dict[int, float] = {}
        # children that predate the round (e.g. a multiprocessing resource tracker that an earlier
        # test started in this same process) are not the round's to clean up
        self.before = {p.pid for p in psutil.Process().children(recursive=True)}

    def snapshot(self) -> None:
        for proc in psutil.Process().children(recursive=True):
            if proc.pid in self.before:
                continue
            try:
                self.seen.setdefault(proc.pid, proc.create_time())
            except psutil.NoSuchProcess:
                continue

    def survivors(self, grace_s: float = 10.0) -> list[str]:
        """Processes still running ``grace_s`` after the stop (orphans such as multiprocessing's
        resource tracker exit on their own once they notice their parent is gone)."""
        deadline = time.monotonic() + grace_s
        while (alive := self._alive()) and time.monotonic() < deadline:
            time.sleep(0.2)
        return alive

    def _alive(self) -> list[str]:
        alive = []
        for pid, created in self.seen.items():
            try:
                proc = psutil.Process(pid)
                if proc.create_time() == created and proc.status() != psutil.STATUS_ZOMBIE:
                    alive.append(f"{pid} {' '.join(proc.cmdline())[:120]}")
            except psutil.NoSuchProcess:
                continue
        return alive


class ChaosRound:
    def __init__(
        self,
        index: int,
        rng: random.Random,
        work: Path,
        policy: str,
        dataset: str,
        faults: list[str],
        appendonly: bool,
    ):
        self.index = index
        self.rng = rng
        self.faults = faults
        self.run_name = f"chaos-{index}-{uuid.uuid4().hex[:6]}"
        self.run_dir = work / self.run_name
        self.ckpt_root = self.run_dir / "checkpoints"
        self.overrides = overrides(self.run_name, self.run_dir, policy, dataset, appendonly)
        self.cfg = load_config(CONFIG, self.overrides, env={})
        self.result = RoundResult(index, appendonly)
        self.procs = _Processes()
        self.kills: list[checks.LearnerKill] = []
        # time.monotonic() of the last SIGKILLed actor
        self.actor_killed_at: float | None = None
        self.wipes_ms: list[int] = []

    # ----- records ---------------------------------------------------------------------------
    def steps(self) -> list[dict]:
        return read_steps(self.run_dir)

    def published_by(self, actor_id: str) -> int:
        return len(read_jsonl(published_path(self.run_dir, actor_id)))

    def wait(self, predicate, timeout: float) -> bool:
        def watched() -> bool:
            self.procs.snapshot()
            return predicate()

        return self.sup.wait_until(watched, timeout, interval=0.2)

    # ----- faults ----------------------------------------------------------------------------
    def kill_actor(self) -> Fault:
        victim = self.rng.choice([a for a in self.sup.actors if a.alive])
        before = self.published_by(victim.name)
        os.kill(victim.proc.pid, signal.SIGKILL)
        t0 = self.actor_killed_at = time.monotonic()
        ok = self.wait(
            lambda: victim.alive and self.published_by(victim.name) > before, RECOVERY_TIMEOUT_S
        )
        return Fault("kill_actor", time.monotonic() - t0 if ok else None, victim.name)

    def kill_learner(self) -> Fault:
        self.sup.learner.proc.kill()
        return self._learner_killed("kill_learner")

    def _learner_killed(self, kind: str, detail: str = "") -> Fault:
        """Book a SIGKILLed learner and wait for the supervisor to bring it back to a step."""
        # the supervisor's next tick reaps the exit code and schedules the restart
        self.sup.learner.proc.wait(30)
        latest = checkpoint.latest(self.ckpt_root)
        ckpt_step = checkpoint.step_of(latest) if latest is not None else 0
        rows = len(self.steps())
        self.kills.append(checks.LearnerKill(rows, ckpt_step))
        t0 = time.monotonic()
        ok = self.wait(lambda: len(self.steps()) > rows, RECOVERY_TIMEOUT_S)
        detail = f"{detail}; " if detail else ""
        return Fault(
            kind, time.monotonic() - t0 if ok else None, f"{detail}checkpoint step {ckpt_step}"
        )

    def _kill_learner_when(self, window) -> bool:
        """SIGKILL the learner the first time ``window()`` is true (polled every POLL_S)."""
        self.wait(lambda: self.sup.learner.alive, RECOVERY_TIMEOUT_S)
        deadline = time.monotonic() + RECOVERY_TIMEOUT_S
        ticked = 0.0
        while time.monotonic() < deadline:
            if window():
                self.sup.learner.proc.kill()
                return True
            if time.monotonic() - ticked > 0.2:
                ticked = time.monotonic()
                self.procs.snapshot()
                self.sup.tick()
            time.sleep(POLL_S)
        return False

    def _missed(self, kind: str) -> Fault:
        self.result.violations.append(
            f"{kind}: its window never came within {RECOVERY_TIMEOUT_S:.0f} s"
        )
        return Fault(kind, None, "window not seen")

    def _aimed(self, kind: str, attempt) -> Fault:
        """Kill the learner by ``attempt()`` (None: its window never came; else (hit, detail)) until
        a kill lands inside the window, AIM_TRIES at most. On a loaded machine the learner can leave
        a short window between the look and the kill; a miss is still a learner kill, booked so."""
        misses = []
        for _ in range(AIM_TRIES):
            outcome = attempt()
            if outcome is None:
                return self._missed(kind)
            hit, detail = outcome
            fault = self._learner_killed(kind, detail)
            if hit or fault.recovery_s is None:
                if misses:
                    fault.detail += f" (after {len(misses)} kill(s) that missed the window)"
                return fault
            misses.append(detail)
        self.result.violations.append(f"{kind} missed its window {AIM_TRIES} times: {misses[-1]}")
        return fault

    def kill_after_read(self) -> Fault:
        redis, keys, group = self.sup.redis, self.sup.keys, self.cfg.broker.consumer_group

        def attempt() -> tuple[bool, str] | None:
            # (consumed, pending) at the previous and the latest poll
            seen: list[tuple[int, int]] = []

            def polled() -> bool:
                pipe = redis.pipeline(transaction=True)
                pipe.get(keys.consumed)
                pipe.xpending(keys.stream, group)
                consumed, pending = pipe.execute()
                seen[:] = [*seen[-1:], (int(consumed or 0), int(pending["pending"]))]
                return len(seen) == 2 and checks.read_not_counted(*seen)

            if not self._kill_learner_when(polled):
                return None
            (_, before), (consumed, pending) = seen
            counted_after = int(redis.get(keys.consumed) or 0)
            detail = (
                f"{pending - before} entries read, consumed {consumed} -> {counted_after} "
                "after the kill"
            )
            return counted_after == consumed, detail

        return self._aimed("kill_after_read", attempt)

    def _checkpoint_state(self) -> tuple[str | None, list[str]]:
        """(folder ``latest`` names, every checkpoint folder), as the learner left them right now."""
        link = self.ckpt_root / checkpoint.LATEST
        try:
            current = os.readlink(link)
        except OSError:
            current = None
        return current, [p.name for p in self.ckpt_root.glob("step-*")]

    def kill_in_save(self) -> Fault:
        def attempt() -> tuple[bool, str] | None:
            state: dict = {}

            def saving() -> bool:
                current, folders = self._checkpoint_state()
                writing = checks.save_in_progress(current, folders)
                state.update(latest=current, writing=writing)
                return writing is not None

            if not self._kill_learner_when(saving):
                return None
            step, save = state["writing"]
            still = self._checkpoint_state()[0] == state["latest"]
            kind = "a same-step re-save" if save else "a save"
            return still, f"during {kind} of step {step} (latest still {state['latest']}: {still})"

        return self._aimed("kill_in_save", attempt)

    def kill_after_switch(self) -> Fault:
        before = self._checkpoint_state()[0]
        if not self._kill_learner_when(lambda: self._checkpoint_state()[0] != before):
            return self._missed("kill_after_switch")
        switched = self._checkpoint_state()[0]
        step = checkpoint.step_of(switched)
        logged = any(r["step"] == step for r in read_jsonl(commits_path(self.run_dir)))
        detail = (
            f"latest -> {switched}, its ack {'logged' if logged else 'not logged'} before the kill"
        )
        return self._learner_killed("kill_after_switch", detail)

    def kill_redis(self) -> Fault:
        rows = len(self.steps())
        server = self.sup.redis_server
        pid = server.proc.pid
        os.kill(pid, signal.SIGKILL)
        # dead before the supervisor's next look, as after any kill from outside
        server.proc.wait(10)
        if not self.cfg.broker.appendonly:
            self.wipes_ms.append(int(time.time() * 1000))
        t0 = time.monotonic()
        ok = self.wait(lambda: len(self.steps()) > rows, RECOVERY_TIMEOUT_S)
        restarted = server.proc is not None and server.proc.pid != pid
        mode = "AOF" if self.cfg.broker.appendonly else "no persistence"
        return Fault(
            "kill_redis",
            time.monotonic() - t0 if ok else None,
            f"{mode}; restarted by the supervisor: {restarted}",
        )

    def stop_actor(self) -> Fault:
        victim = self.rng.choice([a for a in self.sup.actors if a.alive])
        baseline = [r["time"] for r in self.steps()][-4:]
        # each child leads its own session: this freezes its reward workers too
        pgid = victim.proc.pid
        before = self.published_by(victim.name)
        t_stop = time.time()
        os.killpg(pgid, signal.SIGSTOP)
        try:
            self.wait(lambda: False, STOP_FOR_S)
        finally:
            os.killpg(pgid, signal.SIGCONT)
        t_cont = time.time()
        gap = checks.max_step_gap([r["time"] for r in self.steps()], (t_stop, t_cont))
        normal = (
            statistics.median(b - a for a, b in zip(baseline, baseline[1:], strict=False))
            if len(baseline) > 2
            else gap
        )
        bound = SYNC_TIMEOUT_S + 3 * normal
        if gap > bound:
            self.result.violations.append(
                f"learner went {gap:.1f} s without a step while {victim.name} was frozen "
                f"(bound {bound:.1f} s = weightsync.timeout_s + 3 x normal step gap {normal:.1f} s)"
            )
        t0 = time.monotonic()
        ok = self.wait(lambda: self.published_by(victim.name) > before, RECOVERY_TIMEOUT_S)
        detail = f"{victim.name} frozen {t_cont - t_stop:.1f} s; longest learner gap {gap:.1f} s (normal {normal:.1f} s)"
        return Fault("stop_actor", time.monotonic() - t0 if ok else None, detail)

    def restart_redis(self) -> Fault:
        rows = len(self.steps())
        self.sup.redis_server.restart()
        if not self.cfg.broker.appendonly:
            self.wipes_ms.append(int(time.time() * 1000))
        t0 = time.monotonic()
        ok = self.wait(lambda: len(self.steps()) > rows, RECOVERY_TIMEOUT_S)
        return Fault(
            "restart_redis",
            time.monotonic() - t0 if ok else None,
            "AOF" if self.cfg.broker.appendonly else "no persistence",
        )

    # ----- the round -------------------------------------------------------------------------
    def run(self) -> RoundResult:
        started = time.monotonic()
        self.sup = Supervisor(self.cfg, actors=2)
        try:
            self.sup.start()
            if not self.wait(lambda: len(self.steps()) >= 3, START_TIMEOUT_S):
                self.result.violations.append("the learner made no 3 steps after start")
                return self.result
            for kind in self.faults:
                self.wait(lambda: False, self.rng.uniform(0.0, 4.0))
                fault = getattr(self, kind)()
                self.result.faults.append(fault)
                if fault.recovery_s is None:
                    self.result.violations.append(
                        f"no recovery within {RECOVERY_TIMEOUT_S:.0f} s after {kind} ({fault.detail})"
                    )
                    return self.result
            rows = len(self.steps())
            if not self.wait(lambda: len(self.steps()) >= rows + 2, RECOVERY_TIMEOUT_S):
                self.result.violations.append("no progress after the last fault")
            self._stop_processes()
            self._check_records_and_redis()
        finally:
            self.procs.snapshot()
            self.sup.stop()
            self.result.seconds = time.monotonic() - started
        self.result.shm_removed_by_supervisor = sum(
            "stale shared-memory" in e for e in self.sup.events
        )
        self._check_nothing_left()
        return self.result

    def _stop_processes(self) -> None:
        """A clean stop through the supervisor (actors, then the learner), Redis still up."""
        self.sup.scale(0)
        self.sup.learner.proc.send_signal(signal.SIGTERM)
        if not self.wait(lambda: self.sup.learner_finished, 120):
            self.result.violations.append("the learner did not stop within 120 s of SIGTERM")

    def _check_records_and_redis(self) -> None:
        redis, keys = self.sup.redis, self.sup.keys
        published = {}
        for path in (self.run_dir / "published").glob("*.jsonl"):
            published.update({r["group_id"]: r["entry_id"] for r in read_jsonl(path)})
        queued = set()
        for _, fields in redis.xrange(keys.stream):
            try:
                queued.add(decode_group(fields[b"g"]).group_id)
            except (WireError, KeyError):
                self.result.violations.append("an undecodable entry in the stream")
        dead = redis.xrange(keys.dead)
        if dead:
            self.result.violations.append(
                f"{len(dead)} dead-lettered entries: {dead[0][1].get(b'reason')!r}"
            )
        d = checks.delivery(
            published, read_jsonl(commits_path(self.run_dir)), queued, self.wipes_ms
        )
        self.result.delivery = d
        self.result.violations += checks.delivery_violations(d, self.cfg.broker.appendonly)
        steps = self.steps()
        self.result.steps = len(steps)
        self.result.violations += checks.version_violations(steps, self.kills)
        if self.actor_killed_at is not None:
            # the killed actor's leases are meant to outlive it by lease_ttl_s, not a moment longer
            expired_at = self.actor_killed_at + self.cfg.broker.lease_ttl_s + 1.0
            time.sleep(max(0.0, expired_at - time.monotonic()))
        self.result.violations += checks.admission_violations(admission_counts(redis, keys))
        if left := ephemeral_leftovers(redis, keys):
            # a child that did not stop in time was killed before it could clean up: say which
            hung = "".join(f"; {e}" for e in self.sup.events if "ignored SIGTERM" in e)
            self.result.violations.append(
                f"per-process Redis state left after a clean stop: {left}{hung}"
            )
        delete_run_keys(redis, keys)
        if left := run_keys(redis, keys):
            self.result.violations.append(f"Redis keys left after cleanup: {left[:5]}")

    def _check_nothing_left(self) -> None:
        if survivors := self.procs.survivors():
            self.result.violations.append(f"processes outlived the shutdown: {survivors}")
        if segments := list(SHM_DIR.glob(segment_prefix(self.run_name) + "*")):
            self.result.violations.append(f"shared memory left: {[s.name for s in segments]}")


def admission_counts(redis, keys) -> checks.AdmissionCounts:
    """The counters as Redis holds them; expired leases are not counted (nobody pruned them yet)."""
    pipe = redis.pipeline(transaction=True)
    for key in (keys.accepted, keys.consumed, keys.discarded, keys.trimmed):
        pipe.get(key)
    pipe.zcount(keys.leases, f"({int(time.time() * 1000)}", "+inf")
    pipe.xlen(keys.stream)
    accepted, consumed, discarded, trimmed, leases, length = pipe.execute()
    return checks.AdmissionCounts(
        int(accepted or 0),
        int(consumed or 0),
        int(discarded or 0),
        int(trimmed or 0),
        leases,
        length,
    )


def plan(rng: random.Random, quick: bool) -> tuple[list[str], bool]:
    """Faults of one round (each kind at least once per round in a seeded order) and AOF on/off."""
    faults = list(FAULTS + AIMED) + ([] if quick else rng.sample(FAULTS + AIMED, 2))
    rng.shuffle(faults)
    return faults, rng.random() < 0.5


def soak(
    rounds: int, seed: int, quick: bool = False, work: Path | None = None, echo=print
) -> list[RoundResult]:
    from streamrl.examples.reverse_digits.assets import build_policy, write_dataset

    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="streamrl-chaos-") as tmp:
        work = work or Path(tmp)
        policy = str(build_policy(work / "demo-policy"))
        dataset = str(write_dataset(work / "train.jsonl", size=200))
        results = []
        for i in range(rounds):
            faults, appendonly = plan(rng, quick)
            # the first two rounds cover both persistence modes whatever the seed
            if i < 2:
                appendonly = i == 0
            echo(f"round {i}: AOF {'on' if appendonly else 'off'}, faults {faults}")
            result = ChaosRound(
                i, random.Random(rng.random()), work, policy, dataset, faults, appendonly
            ).run()
            results.append(result)
            for f in result.faults:
                echo(
                    f"  {f.kind}: recovered in {f.recovery_s if f.recovery_s is None else round(f.recovery_s, 1)} s ({f.detail})"
                )
            echo(
                f"  {result.steps} steps in {result.seconds:.0f} s; delivery {result.delivery}; violations {result.violations or 'none'}"
            )
    return results


def report(results: list[RoundResult], seed: int, command: str) -> str:
    from bench.__main__ import machine

    by_kind: dict[str, list[float]] = defaultdict(list)
    for r in results:
        for f in r.faults:
            if f.recovery_s is not None:
                by_kind[f.kind].append(f.recovery_s)
    lines = [
        "## Chaos soak",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M')} · {machine()} · `{command}` (seed {seed})",
        "",
        "Redis + learner + 2 actors under the `make run` supervisor, CPU demo policy, 4 groups x 8 completions per step, "
        f"checkpoint every 3 steps, `weightsync.timeout_s={SYNC_TIMEOUT_S:g}`; an actor is frozen for {STOP_FOR_S:g} s.",
        "",
        "| fault | injected | recovery median | recovery max |",
        "|---|---|---|---|",
    ]
    for kind in FAULTS + AIMED:
        times = by_kind.get(kind, [])
        injected = sum(f.kind == kind for r in results for f in r.faults)
        med = f"{statistics.median(times):.1f} s" if times else "-"
        worst = f"{max(times):.1f} s" if times else "-"
        lines.append(f"| {kind} | {injected} | {med} | {worst} |")
    lines += [
        "",
        "| round | AOF | steps | published | committed once | committed twice | still queued | lost (all to wipes w/o AOF) | violations |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        d = r.delivery
        cells = (
            [
                d.published,
                d.committed_once,
                len(d.committed_twice),
                d.still_queued,
                f"{len(d.lost)} ({d.lost_to_wipes})",
            ]
            if d
            else ["-"] * 5
        )
        lines.append(
            f"| {r.index} | {'on' if r.appendonly else 'off'} | {r.steps} | "
            + " | ".join(str(c) for c in cells)
            + f" | {'; '.join(r.violations) or 'none'} |"
        )
    total_lost = sum(len(r.delivery.lost) for r in results if r.delivery)
    clean = sum(not r.violations for r in results)
    lines += [
        "",
        f"{clean}/{len(results)} rounds with every invariant holding; {total_lost} group(s) lost in total, "
        "each published before a Redis restart without persistence (with AOF none may be lost). "
        "Recovery = fault (or SIGCONT) until the victim published again / the learner wrote its next step.",
    ]
    return "\n".join(lines)


def run(quick: bool = False) -> str:
    rounds = 1 if quick else 3
    return report(soak(rounds, seed=0, quick=quick), 0, "make bench")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="each fault kind once per round")
    parser.add_argument("--out", type=Path, default=Path("docs/bench/chaos.md"))
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    from bench.startup import prepare_demo

    prepare_demo()
    results = soak(args.rounds, args.seed, args.quick)
    text = report(
        results, args.seed, f"python -m bench.chaos --rounds {args.rounds} --seed {args.seed}"
    )
    args.out.write_text(text + "\n")
    print(text)
    return 0 if all(not r.violations for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
