"""Version numbers that name one set of weights per run, across learner restarts.

A learner killed after its checkpoint had already announced the versions that
followed it; a restart that numbered its new steps from the checkpoint again
would announce different weights under those numbers. Actors still holding an
old one would take the new announcement for the weights they have and keep
them, and a completion that spans the restart would see its versions go
backwards (the learner dead-letters such a group).

The rule: a restarted learner re-publishes its checkpoint under the
checkpoint's own version only if no later version was ever announced (then that
number names exactly these weights); otherwise under the highest one announced
+ 1, and counts on from there. "Announced" is the larger of what Redis holds
(the admission version, set with every publish) and the learner's step log in
``run.dir`` (which outlives a Redis restart without persistence).

The re-done steps count the versions of the lost steps as versions that
happened, so the data they re-read is older by that gap (masked only beyond
``algo.max_staleness``, as any stale token).
"""

from __future__ import annotations

import json
from pathlib import Path

STEPS_LOG = "learner_steps.jsonl"


def resume_version(checkpoint_version: int, announced: int) -> int:
    """The version a learner restarted from a checkpoint at ``checkpoint_version`` publishes it as."""
    if announced <= checkpoint_version:
        return checkpoint_version
    return announced + 1


def logged_version(run_dir: str | Path) -> int:
    """The highest version in the learner's step log (0 without one; a torn last line is skipped)."""
    highest = 0
    path = Path(run_dir) / STEPS_LOG
    if not path.exists():
        return 0
    with open(path) as f:
        for line in f:
            try:
                highest = max(highest, int(json.loads(line)["version"]))
            except (ValueError, KeyError, TypeError):
                continue
    return highest
