"""Invariants of a chaos round, computed from the run's own records (pure functions, no processes).

Inputs are what the system writes anyway or on request (``actor.publish_log``,
``learner.commit_log``): the actors' published group ids with their stream
entry ids, the learner's commit records, its step log, and what Redis still
holds at the end. Each check returns a list of human-readable violations.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Delivery:
    """Where every published group ended up."""

    published: int
    committed_once: int
    committed_twice: list[str] = field(default_factory=list)
    still_queued: int = 0
    # published, never committed, not in Redis
    lost: list[str] = field(default_factory=list)
    # of `lost`, published before a Redis restart without persistence
    lost_to_wipes: int = 0
    # committed, but the actor died before logging its publish
    committed_unlogged: int = 0


def entry_ms(entry_id: str) -> int:
    return int(entry_id.split("-")[0])


def delivery(
    published: dict[str, str],
    commits: list[dict],
    queued: set[str],
    wipes_ms: list[int],
) -> Delivery:
    """``published``: group id -> stream entry id; ``commits``: {step, groups} records (a resumed
    learner re-acks its checkpoint's list under the same step, which is one commit, not two);
    ``queued``: group ids still in the stream; ``wipes_ms``: times of restarts without persistence."""
    steps_of: dict[str, set[int]] = {}
    for record in commits:
        for gid in record["groups"]:
            steps_of.setdefault(gid, set()).add(record["step"])
    twice = sorted(g for g, steps in steps_of.items() if len(steps) > 1)
    lost = sorted(g for g in published if g not in steps_of and g not in queued)
    latest_wipe = max(wipes_ms, default=-1)
    return Delivery(
        published=len(published),
        committed_once=sum(1 for g in published if len(steps_of.get(g, ())) == 1),
        committed_twice=twice,
        still_queued=sum(1 for g in published if g in queued and g not in steps_of),
        lost=lost,
        lost_to_wipes=sum(1 for g in lost if entry_ms(published[g]) <= latest_wipe),
        committed_unlogged=sum(1 for g in steps_of if g not in published),
    )


def delivery_violations(d: Delivery, persistent: bool) -> list[str]:
    out = [f"group {g} committed by more than one step" for g in d.committed_twice[:5]]
    if persistent and d.lost:
        out.append(f"{len(d.lost)} accepted group(s) lost with AOF persistence on: {d.lost[:5]}")
    if not persistent and len(d.lost) > d.lost_to_wipes:
        out.append(
            f"{len(d.lost) - d.lost_to_wipes} lost group(s) were published after the last Redis wipe"
        )
    return out


@dataclass
class LearnerKill:
    # step records written before the kill
    rows_before: int
    # what `checkpoints/latest` held when the learner died (0 = none)
    checkpoint_step: int


def version_violations(rows: list[dict], kills: list[LearnerKill]) -> list[str]:
    """Versions rise within one learner life; a restarted learner resumes from its checkpoint, never
    from scratch (first new step = checkpoint step + 1, version above the checkpoint's)."""
    out = []
    bounds = [k.rows_before for k in kills] + [len(rows)]
    start = 0
    for i, end in enumerate(bounds):
        # a batch whose every group was dropped writes a row without an update (trained false)
        life = [r for r in rows[start:end] if r.get("trained", True)]
        versions = [r["version"] for r in life]
        if versions != sorted(set(versions)):
            out.append(f"learner life {i}: versions not strictly increasing: {versions[:10]}")
        if i > 0 and life:
            kill = kills[i - 1]
            ckpt_rows = [r for r in rows[:start] if r["step"] == kill.checkpoint_step]
            ckpt_version = ckpt_rows[-1]["version"] if ckpt_rows else 0
            first = life[0]
            if first["step"] != kill.checkpoint_step + 1 or first["version"] <= ckpt_version:
                out.append(
                    f"learner life {i} started at step {first['step']} version {first['version']}, "
                    f"checkpoint was step {kill.checkpoint_step} version {ckpt_version}"
                )
        start = end
    return out


@dataclass
class AdmissionCounts:
    """Redis's admission counters after a clean stop (broker.admission)."""

    accepted: int
    # groups taken by the learner's completed steps
    consumed: int
    # acked without training: dead-lettered, duplicates
    discarded: int
    # removed unread by a MAXLEN trim
    trimmed: int
    # unexpired leases
    live_leases: int
    # entries still in the stream (unread, or read by no completed step)
    stream_length: int


def admission_violations(c: AdmissionCounts) -> list[str]:
    """Every accepted group is accounted for exactly once: taken by a completed step, discarded,
    trimmed, or still in the stream; and no slot stays leased. An imbalance is a slot leaked
    (accepted > the rest: actors starve for good) or counted twice (the staleness bound loosens)."""
    out = []
    taken = c.consumed + c.discarded + c.trimmed + c.stream_length
    if c.accepted != taken:
        out.append(
            f"admission counters unbalanced: accepted {c.accepted} != consumed {c.consumed} + "
            f"discarded {c.discarded} + trimmed {c.trimmed} + in stream {c.stream_length}"
        )
    if c.live_leases:
        out.append(f"{c.live_leases} admission lease(s) still live after a clean stop")
    return out


def read_not_counted(before: tuple[int, int], now: tuple[int, int]) -> bool:
    """Two polls of (``adm:consumed``, the learner's pending count): it read entries (XREADGROUP
    grew its pending list) that no completed step has counted yet: ``kill_after_read``'s window."""
    return now[0] == before[0] and now[1] > before[1]


def save_in_progress(latest: str | None, folders: list[str]) -> tuple[int, int] | None:
    """(step, save) of a checkpoint folder newer than the one ``latest`` names: a save (``save`` > 0:
    a re-save of that step) being written, ``kill_in_save``'s window; None when there is none."""

    def order(name: str) -> tuple[int, int]:
        step, save = name.removeprefix("step-").split(".")
        return int(step), int(save)

    newest = max((order(f) for f in folders), default=None)
    if newest is None or (latest is not None and newest <= order(latest)):
        return None
    return newest


def max_step_gap(times: list[float], window: tuple[float, float]) -> float:
    """Longest stretch inside ``window`` without a learner step (window edges count as boundaries)."""
    lo, hi = window
    inside = sorted(t for t in times if lo <= t <= hi)
    edges = [lo, *inside, hi]
    return max(b - a for a, b in zip(edges, edges[1:], strict=False))
